//go:build integration

package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBlockDiskVerbs: the verbs besides a live fork carry a data disk on
// a block device (a loop device the test makes and removes), each checked
// by what the guest reads: hibernate and resume of a machine that still
// writes in place (the hibernation freezes the device), a disk-only fork,
// a checkpoint and a rewind to it, and a template saved, exported and
// imported; the device is never written after that first freeze, and the
// commit at the end puts the source's last write on it.
func TestBlockDiskVerbs(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	dev := testLoopDevice(t, 8<<20)
	e := newEnv(t)
	e.boot("src", "--disk", "id=data,file="+dev)
	const data = "/dev/vdb"
	// conv=fsync: the guest flushes the disk's cache, so that the write
	// is in the image on the host (qcow2's metadata is QEMU's until a
	// flush; a sync writes a raw device's pages back, flushing nothing).
	write := func(m, s string) {
		t.Helper()
		e.exec(m, "sh", "-c", "dd if=/dev/zero of="+data+" bs=16 count=1 conv=notrunc,fsync 2>/dev/null && printf "+s+" | dd of="+data+" conv=notrunc,fsync 2>/dev/null")
	}
	read := func(m string) string {
		t.Helper()
		out := e.exec(m, "sh", "-c", "sync; echo 3 >/proc/sys/vm/drop_caches; dd if="+data+" bs=16 count=1 2>/dev/null | tr -d '\\000'")
		return strings.TrimSpace(out)
	}
	expect := func(step, m, want string) {
		t.Helper()
		if got := read(m); got != want {
			t.Errorf("%s: %s's data disk reads %q, want %q", step, m, got, want)
		}
		// What the guest synced is in the image the record names.
		if got := recordedData(t, e, m, "data"); got != want {
			t.Errorf("%s: %s's data disk as recorded reads %q on the host, want %q", step, m, got, want)
		}
	}
	var frozen string
	unchanged := func(step string) {
		t.Helper()
		if got := deviceSum(t, dev); got != frozen {
			t.Errorf("%s: the device changed after the freeze (sha256 %s, frozen %s)", step, got, frozen)
		}
	}

	// Hibernate while the disk is written in place: the device is frozen
	// there, and the resumed machine writes to an overlay on it.
	write("src", "INPLACE")
	if got := deviceHead(t, dev, 16); got != "INPLACE" {
		t.Fatalf("before the hibernation the device reads %q, want INPLACE written in place", got)
	}
	e.ok("hibernate", "src")
	frozen = deviceSum(t, dev)
	e.ok("resume", "src")
	expect("after hibernate and resume", "src", "INPLACE")
	write("src", "HIB")
	unchanged("after the resumed machine's write")

	expect("after the resumed machine's write", "src", "HIB")

	// A disk-only fork: the child boots from the view frozen with the
	// guest's filesystems, its disk an overlay on the source's.
	e.ok("fork", "src", "d1", "--disk-only")
	write("src", "DONLY")
	expect("disk-only child", "d1", "HIB")
	write("d1", "D1")
	expect("after the disk-only child wrote", "src", "DONLY")
	e.ok("rm", "-f", "d1")
	unchanged("after the disk-only fork")

	// A checkpoint and a rewind to it take the data disk back.
	e.ok("checkpoint", "src", "--as", "cp")
	write("src", "LATER")
	e.ok("rewind", "src", "--to", "cp")
	expect("after the rewind", "src", "DONLY")
	write("src", "REWOUND")
	expect("a write after the rewind", "src", "REWOUND")
	unchanged("after the rewind")

	// A template saved, exported and imported: the archive holds the
	// disk's whole chain, the device's part too, flattened.
	e.ok("template", "save", "src", "k")
	write("src", "SAVED")
	expect("a write after the save", "src", "SAVED")
	file := filepath.Join(t.TempDir(), "k.vmfork")
	e.ok("template", "export", "k", file)
	e.ok("template", "rm", "k")
	e.ok("template", "import", file, "--as", "k2")
	e.ok("fork", "k2", "i1")
	expect("child of the imported template", "i1", "REWOUND")
	e.ok("rm", "-f", "i1")
	e.ok("template", "rm", "k2")
	unchanged("after the export and import")

	// Once nothing reads the device, the commit puts the source's last
	// write on it.
	expect("after the export and import", "src", "SAVED")
	// Flushed: an unflushed write of a rewound machine was seen lost at its
	// stop (2026-12-02, not yet explained; see the branch's report).
	write("src", "LAST")
	e.ok("template", "rm", "cp")
	e.ok("stop", "src")
	e.ok("disk", "commit", "src")
	if got := deviceHead(t, dev, 16); got != "LAST" {
		t.Errorf("after the commit the device reads %q, want the source's LAST", got)
	}
	// A template kept after its source went still holds the device
	// frozen: a boot that would write it in place is refused.
	e.ok("template", "save", "src", "kend")
	e.ok("rm", "-f", "src")
	runBadCases(t, e, []badCase{
		{"block disk a kept template holds", []string{"boot", "b", "--kernel", e.guest.Kernel, "--initrd", e.guest.Initrd, "--disk", e.guest.Disk, "--disk", "id=data,file=" + dev},
			2, `block device ` + dev + ` is the frozen base of template "kend"'s disk "data" (vmfork template rm kend first)`},
	}, func(t *testing.T) {
		if ms := e.list(); len(ms) != 0 {
			t.Errorf("machines after bad input: %v, want none", ms)
		}
	})
	e.ok("template", "rm", "kend")
}

// recordedData reads, on the host, the start of the image machine m's
// record names for extra disk id (through its backing chain; -U: its QEMU
// holds it), NULs and qemu-io's dots for them dropped.
func recordedData(t *testing.T, e *env, m, id string) string {
	t.Helper()
	var rec struct {
		Paths struct {
			Disks map[string]struct {
				File  string `json:"file"`
				Block bool   `json:"block"`
			} `json:"disks"`
		} `json:"paths"`
	}
	data, err := os.ReadFile(filepath.Join(e.stateDir, "machines", m, "machine.json"))
	if err == nil {
		err = json.Unmarshal(data, &rec)
	}
	if err != nil {
		t.Fatalf("%s's record: %v", m, err)
	}
	f := rec.Paths.Disks[id]
	if f.Block {
		return deviceHead(t, f.File, 16)
	}
	out, err := exec.Command("qemu-io", "-U", "-r", "-f", "qcow2", "-c", "read -v 0 16", f.File).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-io %s: %v: %s", f.File, err, out)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	fields := strings.Fields(line)
	if len(fields) == 0 {
		t.Fatalf("qemu-io %s: %q", f.File, out)
	}
	return strings.TrimRight(fields[len(fields)-1], ".")
}
