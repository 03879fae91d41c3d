//go:build integration

package tests

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// debianVariant is one way to boot the Debian guest: the same stock image
// with systemd's own kernel command line switches (systemd.mask=) choosing
// the network stack and whether dbus runs.
type debianVariant struct {
	Name    string // e.g. "ifupdown-nodbus"
	Network string // "ifupdown" (networking.service and dhclient) or "networkd" (systemd-networkd)
	DBus    bool   // dbus.service and dbus.socket run; without them hostnamectl finds no bus
	Append  string // the kernel command line, for vmfork boot --append
}

// debianImage is the built Debian 12 guest (tests/guest/debian/build.sh).
// Disk is root.qcow2, booted as root=/dev/vda; it is never written: vmfork
// puts an overlay on it.
type debianImage struct {
	guest
	Variants []debianVariant
}

// variant returns the variant called name ("ifupdown-dbus", "ifupdown-nodbus",
// "networkd-dbus", "networkd-nodbus").
func (d debianImage) variant(t testing.TB, name string) debianVariant {
	t.Helper()
	for _, v := range d.Variants {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("Debian guest has no variant %q (have %v)", name, d.variantNames())
	return debianVariant{}
}

func (d debianImage) variantNames() []string {
	var names []string
	for _, v := range d.Variants {
		names = append(names, v.Name)
	}
	return names
}

// debianGuest returns the Debian guest built into $VMFORK_DEBIAN_GUEST.
func debianGuest(t testing.TB) debianImage {
	t.Helper()
	dir := os.Getenv("VMFORK_DEBIAN_GUEST")
	if dir == "" {
		t.Fatal("VMFORK_DEBIAN_GUEST is not set: run `make guest-debian` and set it to the directory " +
			"it prints (default /var/cache/vmfork/debian-guest), or use `make integration`")
	}
	// The build's own directory, not the links through OUTDIR/current: a
	// rebuild switches current, and an overlay names its backing file by path.
	if build, err := filepath.EvalSymlinks(filepath.Join(dir, "current")); err == nil {
		dir = build
	}
	d := debianImage{guest: guest{
		Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.img"),
		Disk:   filepath.Join(dir, "root.qcow2"),
	}}
	for _, p := range []string{d.Kernel, d.Initrd, d.Disk} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("Debian guest not built in %s (make guest-debian): %v", dir, err)
		}
	}
	rel, err := os.ReadFile(filepath.Join(dir, "kernel-release"))
	if err != nil {
		t.Fatalf("Debian guest not built in %s (make guest-debian): %v", dir, err)
	}
	d.KernelRelease = strings.TrimSpace(string(rel))
	f, err := os.Open(filepath.Join(dir, "variants"))
	if err != nil {
		t.Fatalf("Debian guest not built in %s (make guest-debian): %v", dir, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, appendLine, ok := strings.Cut(sc.Text(), "\t")
		if !ok {
			continue
		}
		network, dbus, ok := strings.Cut(name, "-")
		if !ok || (network != "ifupdown" && network != "networkd") || (dbus != "dbus" && dbus != "nodbus") {
			t.Fatalf("%s: variant %q is not NETWORK-DBUS", f.Name(), name)
		}
		d.Variants = append(d.Variants, debianVariant{Name: name, Network: network, DBus: dbus == "dbus", Append: appendLine})
	}
	if err := sc.Err(); err != nil || len(d.Variants) == 0 {
		t.Fatalf("%s: no variants (%v): rebuild with make guest-debian", f.Name(), err)
	}
	return d
}

// debianEnv is an env whose guest is the Debian image: env's helpers (ok,
// jsonOK, exec, list, cleanup of every QEMU process) work on it as they do on
// the busybox guest.
type debianEnv struct {
	*env
	deb debianImage
}

// newDebianEnv is newEnv for the Debian guest. It needs VMFORK_BIN and
// VMFORK_DEBIAN_GUEST, not VMFORK_GUEST.
func newDebianEnv(t testing.TB) *debianEnv {
	t.Helper()
	d := debianGuest(t)
	return &debianEnv{env: newEnvGuest(t, d.guest), deb: d}
}

// debianMemory is the RAM a Debian guest gets unless extra says --memory:
// systemd, sshd and the agent use about 100 MiB of it.
const debianMemory = "512M"

// debianBootTimeout bounds vmfork boot (until the agent answers) under TCG
// on a loaded host; it takes tens of seconds there.
const debianBootTimeout = 5 * time.Minute

// bootDebian boots the Debian guest as name in variant v and returns once its
// guest agent answers (systemd may still be starting units: see settle).
// extra goes to vmfork boot, e.g. "--port", "22" or "--memory", "1G".
func (e *debianEnv) bootDebian(name string, v debianVariant, extra ...string) machineJSON {
	e.t.Helper()
	args := []string{"--timeout", debianBootTimeout.String(), "boot", name,
		"--kernel", e.deb.Kernel, "--initrd", e.deb.Initrd, "--disk", e.deb.Disk, "--append", v.Append}
	hasMemory := false
	for _, a := range extra {
		hasMemory = hasMemory || a == "--memory" || a == "-m" || strings.HasPrefix(a, "--memory=")
	}
	if !hasMemory {
		args = append(args, "--memory", debianMemory)
	}
	var m machineJSON
	e.jsonOK(&m, append(args, extra...)...)
	return m
}

// settle waits (bounded) until systemd has finished booting machine name and
// returns `systemctl is-system-running`: "running", or "degraded" with failed
// units (listed by failedUnits). It fails the test if boot never finishes.
func (e *debianEnv) settle(name string) string {
	e.t.Helper()
	// --wait blocks in the guest until the boot job queue is empty; the outer
	// timeouts keep a stuck guest from hanging the test.
	r := e.vmfork("--timeout", "5m", "exec", name, "--", "timeout", "240", "systemctl", "is-system-running", "--wait")
	state := strings.TrimSpace(r.stdout)
	if state == "" || state == "initializing" || state == "starting" {
		e.t.Fatalf("%s: systemd did not finish booting: %s", name, r)
	}
	return state
}

// failedUnits lists the failed systemd units of machine name.
func (e *debianEnv) failedUnits(name string) []string {
	e.t.Helper()
	out := e.exec(name, "systemctl", "list-units", "--state=failed", "--plain", "--no-legend", "--no-pager")
	var units []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			units = append(units, f[0])
		}
	}
	return units
}

// unitActive returns `systemctl is-active UNIT` in machine name ("active",
// "inactive", "failed", ...), whatever its exit code.
func (e *debianEnv) unitActive(name, unit string) string {
	e.t.Helper()
	r := e.vmfork("exec", name, "--", "systemctl", "is-active", unit)
	return strings.TrimSpace(r.stdout)
}

// waitIPv4 waits (bounded) until eth0 of machine name has an IPv4 address and
// returns `ip -4 -o addr show dev eth0`.
func (e *debianEnv) waitIPv4(name string, timeout time.Duration) string {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out := e.exec(name, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if strings.Contains(out, " inet ") {
			return out
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: eth0 has no IPv4 address after %v: %q", name, timeout, out)
		}
		time.Sleep(time.Second)
	}
}
