//go:build integration

package tests

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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
