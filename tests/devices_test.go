//go:build integration

package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ivshmemArgs boot the stand-in for a passed-through device of mechanics
// §12: ivshmem-plain in peer mode registers a migration blocker; on the spare
// pcie-root-port it can be unplugged.
func ivshmemArgs(memDir string) []string {
	return []string{
		"--object", "memory-backend-file,id=hm,size=1M,mem-path=" + filepath.Join(memDir, "ivshmem-test") + ",share=on",
		"--device", "ivshmem-plain,memdev=hm,id=ivs0,bus=rp2",
	}
}

// hasIvshmem reports whether the guest of machine name sees an ivshmem PCI
// device (1af4:1110).
func (e *env) hasIvshmem(name string) bool {
	e.t.Helper()
	out := e.vmfork("exec", name, "--", "sh", "-c", "grep -l 0x1110 /sys/bus/pci/devices/*/device")
	return strings.Contains(out.stdout, "/sys/bus/pci/devices/")
}

// TestDetachDevices forks a source with a device that forbids migrating it:
// without --detach-devices the fork is refused in one line naming the device,
// before any pause and with nothing made; with it the device is unplugged,
// the fork made, and the device plugged back into the source, which can be
// refused and detached again; the children have no such device and fork
// without the flag.
func TestDetachDevices(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("dev", ivshmemArgs(e.memDir)...)
	if !e.hasIvshmem("dev") {
		t.Fatal("the source's guest does not see its ivshmem device")
	}

	before := e.snapshot()
	r := e.vmfork("-q", "fork", "dev")
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	switch {
	case r.code == 0:
		t.Fatalf("fork of a source with a migration blocker: got success, want a refusal")
	case len(lines) != 1 || !strings.Contains(lines[0], "device ivs0 (ivshmem-plain)") || !strings.Contains(lines[0], "--detach-devices"):
		t.Errorf("refusal does not name the device in one line: %s", r)
	default:
		t.Logf("refused: %s", lines[0])
	}
	if after := e.snapshot(); after != before {
		t.Errorf("a refused fork left something behind:\n got %+v\nwant %+v", after, before)
	}
	if st, _ := e.qmpStatusGenID(e.list()[0].QMP); st != "running" {
		t.Errorf("source after the refusal: %s, want running", st)
	}

	for i, child := range []string{"dev-a", "dev-b"} {
		e.ok("fork", "dev", child, "--detach-devices")
		if !e.hasIvshmem("dev") {
			t.Errorf("fork %d: the device is not plugged back into the source", i+1)
		}
		if e.hasIvshmem(child) {
			t.Errorf("fork %d: child %s has the detached device", i+1, child)
		}
		for _, pid := range e.qemuProcesses() {
			argv := cmdlineOf(pid)
			if strings.Contains(argv, "guest="+child+" ") && strings.Contains(argv, "ivshmem") {
				t.Errorf("fork %d: child %s's QEMU has the device or its backend: %s", i+1, child, argv)
			}
		}
	}
	// Plugged back, the device blocks again.
	if r := e.vmfork("-q", "fork", "dev"); r.code == 0 || !strings.Contains(r.stderr, "device ivs0") {
		t.Errorf("fork after the device was plugged back: got %s, want a refusal naming ivs0", r)
	}
	// A child has no blocker: it forks without the flag.
	e.ok("fork", "dev-a", "dev-a-1")
	e.checkLive("after", []string{"dev", "dev-a"})
}

// cmdlineOf is process pid's command line, words separated by spaces.
func cmdlineOf(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// shmemXML is the ivshmem stand-in of mechanics §12 as libvirt domain XML:
// libvirt puts it on a pcie-to-pci-bridge, where it can be unplugged live.
const shmemXML = "<shmem name='%s'><model type='ivshmem-plain'/><size unit='M'>1</size></shmem>\n"

// domainHasIvshmem reports whether the guest of domain name sees an ivshmem
// PCI device (1af4:1110), waiting up to a few seconds for a hot-plug to
// show when want is true.
func domainHasIvshmem(t *testing.T, name string, want bool) bool {
	t.Helper()
	has := func() bool {
		out := agentRun(t, name, "/bin/sh", "-c", "grep -l 0x1110 /sys/bus/pci/devices/*/device || true")
		return strings.Contains(out, "/sys/bus/pci/devices/")
	}
	if want {
		return eventually(20*time.Second, has)
	}
	return has()
}

// TestLibvirtDetachDevices is TestDetachDevices on the libvirt driver, with
// an operator's domain that has a <shmem> device: without --detach-devices
// the fork is refused before any pause, in one line naming the device; with
// it the fork works, the device is back in the source (libvirt's live XML
// and the guest), and the child has none and forks without the flag.
func TestLibvirtDetachDevices(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	p := d.n("shm")
	x := operatorXML(p, d.guest, "", sharedFileRAM, noBalloon)
	// QEMU as root, as vmfork's own domains: the test needs no image
	// reachable by libvirt's QEMU user.
	x = strings.Replace(x, "  <devices>\n", "  <seclabel type='static' model='dac' relabel='no'><label>+0:+0</label></seclabel>\n  <devices>\n", 1)
	x = strings.Replace(x, "  </devices>", "    "+fmt.Sprintf(shmemXML, p)+"  </devices>", 1)
	defineDomain(t, p, x, true)
	t.Cleanup(func() { os.Remove("/dev/shm/" + p) }) // libvirt's ivshmem backing file
	waitAgent(t, p)
	if !domainHasIvshmem(t, p, true) {
		t.Fatal("the domain's guest does not see its ivshmem device")
	}

	r := d.cli("-q", "fork", p)
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	want := fmt.Sprintf("<shmem name='%s'>", p)
	switch {
	case r.code == 0:
		t.Fatalf("fork of a domain with a <shmem> device: got success, want a refusal")
	case len(lines) != 1 || !strings.Contains(lines[0], want) || !strings.Contains(lines[0], "--detach-devices"):
		t.Errorf("refusal does not name %s and --detach-devices in one line: %s", want, r)
	default:
		t.Logf("refused: %s", lines[0])
	}
	if st := strings.TrimSpace(virshOK(t, "domstate", p)); st != "running" {
		t.Errorf("source after the refusal: %s, want running", st)
	}
	if ds := domains(t, d.prefix); len(ds) != 1 {
		t.Errorf("domains after the refusal = %v, want only %s", ds, p)
	}

	c := d.n("shm-c")
	d.cliOK("fork", p, c, "--detach-devices")
	if !strings.Contains(dumpxml(t, p, false), want) {
		t.Errorf("the source's live XML has no %s after the fork", want)
	}
	if !domainHasIvshmem(t, p, true) {
		t.Errorf("the device is not plugged back into the source's guest")
	}
	if strings.Contains(dumpxml(t, c, false), "<shmem") {
		t.Errorf("child %s has a <shmem> device", c)
	}
	if domainHasIvshmem(t, c, false) {
		t.Errorf("child %s's guest sees the detached device", c)
	}
	// Plugged back, the device blocks again; the child has no blocker.
	if r := d.cli("-q", "fork", p); r.code == 0 || !strings.Contains(r.stderr, want) {
		t.Errorf("fork after the device was plugged back: got %s, want a refusal naming %s", r, want)
	}
	d.cliOK("fork", c, c+"-1")
	d.cliOK("rm", c+"-1", c)
}
