//go:build integration

package tests

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStopKeepsChildWrites: a fork child's write that its guest synced but
// never flushed to the disk's cache (dd to a block device, then sync) is on
// its disk after vmfork stop and start, as it is for a booted machine, and
// after its guest powered itself off. QEMU 7.2 loading a device state with
// migration.announce-rounds=0 segfaulted at the guest's virtio-net reset
// during power-off, before its exit path flushed the block layer: the
// qcow2 metadata of the write was lost and the disk read the parent's data
// again. vmfork stop also flushes first (qemudrv.Driver.flushDisks), so
// only the guest's own power-off fails with announce-rounds=0.
func TestStopKeepsChildWrites(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	data := filepath.Join(t.TempDir(), "data.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", data, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	e.boot("src", "--disk", "id=data,file="+data)
	write := func(m, s string) {
		t.Helper()
		e.exec(m, "sh", "-c", "printf "+s+" | dd of=/dev/vdb bs=8 count=1 conv=notrunc 2>/dev/null && sync")
	}
	read := func(m string) string {
		t.Helper()
		out := e.exec(m, "sh", "-c", "echo 3 >/proc/sys/vm/drop_caches; dd if=/dev/vdb bs=8 count=1 2>/dev/null")
		return strings.TrimSpace(out)
	}
	write("src", "PARENT01")
	e.ok("fork", "src", "kid")
	write("kid", "CHILD-01")
	e.ok("stop", "kid")
	e.ok("start", "kid")
	if got := read("kid"); got != "CHILD-01" {
		t.Errorf("after stop and start the child's disk reads %q, want its own synced write CHILD-01", got)
	}
	// A guest that powers itself off (poweroff -f inside it, no vmfork
	// stop and so no flush asked first): QEMU's own exit path flushes. It
	// did not reach it before: the loaded QEMU segfaulted at the guest
	// driver's virtio-net reset (qemudrv.announceRounds), and the write
	// read back as the parent's.
	stopped := func(m, by string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for e.machine(m).State != "stopped" {
			if time.Now().After(deadline) {
				t.Fatalf("%s still %s 60 s after its guest's %s", m, e.machine(m).State, by)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	e.ok("fork", "src", "own")
	write("own", "OWNOFF01")
	e.exec("own", "sh", "-c", "(sleep 0.3; poweroff -f) >/dev/null 2>&1 &")
	stopped("own", "poweroff -f")
	e.ok("start", "own")
	if got := read("own"); got != "OWNOFF01" {
		t.Errorf("after its guest powered itself off and a start the child's disk reads %q, want its synced write OWNOFF01", got)
	}
	// A child whose guest reboots: its device state carries no firmware
	// (the RAM blocks stay out of it), so its QEMU exits (-no-reboot)
	// rather than run zeros at the reset vector forever. It is stopped,
	// its write kept, and starts from its disk.
	e.ok("fork", "src", "reboots")
	write("reboots", "REBOOT01")
	e.exec("reboots", "sh", "-c", "(sleep 0.3; reboot -f) >/dev/null 2>&1 &")
	stopped("reboots", "reboot -f")
	e.ok("start", "reboots")
	if got := read("reboots"); got != "REBOOT01" {
		t.Errorf("after its guest rebooted and a start the child's disk reads %q, want its synced write REBOOT01", got)
	}
	// The same for a rewound machine, which also runs a QEMU that loaded
	// a device state.
	e.ok("checkpoint", "src", "--as", "cp")
	e.ok("rewind", "src", "--to", "cp")
	write("src", "REWOUND1")
	e.ok("stop", "src")
	e.ok("start", "src")
	if got := read("src"); got != "REWOUND1" {
		t.Errorf("after rewind, stop and start the disk reads %q, want the synced write REWOUND1", got)
	}
}
