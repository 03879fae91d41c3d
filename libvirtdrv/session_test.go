package libvirtdrv

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/contract"
)

func TestIsLocalSession(t *testing.T) {
	for uri, want := range map[string]bool{
		"qemu:///session":                  true,
		"qemu:///session?socket=/x":        true,
		"qemu:///system":                   false,
		"qemu+ssh://host/session":          false,
		"qemu:///sessionx":                 false,
		"test:///default":                  false,
		"qemu+unix:///session?socket=/x/y": false,
	} {
		if got := isLocalSession(uri); got != want {
			t.Errorf("isLocalSession(%q) = %v, want %v", uri, got, want)
		}
	}
}

// A session daemon has no DAC security driver: its domains carry no
// <seclabel>, the system daemon's the user's own.
func TestSessionDomainHasNoDACLabel(t *testing.T) {
	if user("qemu:///session") != "" {
		t.Errorf("user(session) = %q, want no label", user("qemu:///session"))
	}
	if u := user("qemu:///system"); !strings.HasPrefix(u, "+") {
		t.Errorf("user(system) = %q, want +UID:+GID", u)
	}
	m := &vmfork.Machine{Name: "m"}
	m.Spec.MemoryMiB, m.Spec.CPUs = 256, 1
	if got := BootXML(m, Metadata{Machine: "m"}, BootOptions{User: user("qemu:///session")}).SecLabel; len(got) != 0 {
		t.Errorf("session domain's seclabels %+v, want none", got)
	}
}

func TestSessionRefusesSystemOnlyNetworking(t *testing.T) {
	m := &vmfork.Machine{Name: "m"}
	err := checkSessionNetwork("qemu:///session", m, vmfork.Network{Kind: vmfork.NetworkLibvirt, Name: "default"})
	if !errors.Is(err, vmfork.ErrUnsupported) || !strings.Contains(err.Error(), "needs qemu:///system") || strings.Contains(err.Error(), "\n") {
		t.Errorf("libvirt network in session mode: %v, want a one-line refusal", err)
	}
	for _, n := range []vmfork.Network{{Kind: vmfork.NetworkBridge, Name: "br0"}, {Kind: vmfork.NetworkUser}} {
		if err := checkSessionNetwork("qemu:///session", m, n); err != nil {
			t.Errorf("%+v in session mode: %v, want allowed", n, err)
		}
	}
	if err := checkSessionNetwork("qemu:///system", m, vmfork.Network{Kind: vmfork.NetworkLibvirt, Name: "default"}); err != nil {
		t.Errorf("libvirt network on the system daemon: %v", err)
	}
	m.Contract = &contract.Contract{Network: &contract.Network{}}
	if err := checkSessionContract("qemu:///session", m); !errors.Is(err, vmfork.ErrUnsupported) || !strings.Contains(err.Error(), "nwfilter") {
		t.Errorf("contract network rules in session mode: %v, want refused naming nwfilter", err)
	}
	if err := checkSessionContract("qemu:///system", m); err != nil {
		t.Errorf("contract on the system daemon: %v", err)
	}
}

// SessionSetup writes memory_backing_dir into a user's qemu.conf it makes,
// keeps what else is there, and changes nothing the second time.
func TestSessionSetup(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "libvirt", "qemu.conf")
	dir, err := os.MkdirTemp("/dev/shm", "vmfork-unit-")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	defer os.RemoveAll(dir)
	ram := filepath.Join(dir, "lv")
	if _, err := SessionSetup(conf, t.TempDir(), false); err == nil {
		t.Error("a memory backing dir on disk was accepted")
	}
	dry, err := SessionSetup(conf, ram, true)
	if err != nil || !dry.Changed {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	if _, err := os.Stat(conf); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a dry run wrote %s: %v", conf, err)
	}
	res, err := SessionSetup(conf, ram, false)
	if err != nil || !res.Changed || res.MemoryBackingDir != ram+"/libvirt/qemu" {
		t.Fatalf("first run: %+v, %v", res, err)
	}
	if got, _ := configuredMemoryBackingDir(conf); got != ram {
		t.Errorf("qemu.conf's memory_backing_dir %q, want %q", got, ram)
	}
	if st, err := os.Stat(ram); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v, want a 0700 directory", ram, err)
	}
	again, err := SessionSetup(conf, ram, false)
	if err != nil || again.Changed {
		t.Errorf("second run: %+v, %v; want nothing changed", again, err)
	}
}

// A hook directory made under umask 077 is opened to every user's session
// daemon, which exits when it cannot list it.
func TestOpenHookDir(t *testing.T) {
	d := filepath.Join(t.TempDir(), "qemu.d")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := openHookDir(d); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(d); st.Mode().Perm() != 0o755 {
		t.Errorf("hook dir mode %04o, want 0755", st.Mode().Perm())
	}
}

// The release hook's reaper reaches the user's running session daemon, not
// one it would start without XDG_RUNTIME_DIR.
func TestReapURI(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	if got := reapURI("qemu:///session"); got != "qemu:///session?socket=/run/user/1000/libvirt/libvirt-sock" || !isLocalSession(got) {
		t.Errorf("reapURI(session) = %q", got)
	}
	for _, u := range []string{"qemu:///system", "qemu:///session?socket=/x"} {
		if got := reapURI(u); got != u {
			t.Errorf("reapURI(%q) = %q, want it unchanged", u, got)
		}
	}
}
