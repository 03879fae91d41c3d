//go:build integration

package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmfork/vmfork/internal/testloop"
)

// testLoopDevice makes a loop device on a sparse file of size bytes in a
// temporary directory. Its cleanup is registered before the caller's env,
// so it runs after the env has killed its QEMUs (t.Cleanup is last in,
// first out), on every path.
func testLoopDevice(t *testing.T, size int64) string {
	t.Helper()
	dev, _ := loopDevice(t, size)
	return dev
}

// loopDevice makes a loop device as testLoopDevice does and also returns
// its removal, for a caller done with it before the test ends (a crash
// matrix row); the removal runs once, whichever of the two comes first
// (internal/testloop). A host that cannot make one fails the test.
func loopDevice(t *testing.T, size int64) (string, func()) {
	t.Helper()
	dev, remove, err := testloop.New(t, size)
	if err != nil {
		t.Fatal(err)
	}
	return dev, remove
}

// deviceSum is the sha256 of the whole device, read on the host.
func deviceSum(t *testing.T, dev string) string {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// deviceHead is the first n bytes of the device, read on the host, NULs
// dropped.
func deviceHead(t *testing.T, dev string, n int) string {
	t.Helper()
	return strings.ReplaceAll(string(deviceBytes(t, dev, 0, n)), "\x00", "")
}

// deviceBytes is n bytes of the device at off, read on the host.
func deviceBytes(t *testing.T, dev string, off int64, n int) []byte {
	t.Helper()
	return testloop.Bytes(t, dev, off, n)
}

// TestBlockDisk: a data disk on a loop device is written in place until
// the fork; the fork freezes the device where it is, the children read the
// source's data through their overlays and keep their writes there, the
// source's new writes go to its overlay, and the device is not written
// (checksummed); a second fork freezes the source's overlay on it. The
// commit is refused while the source runs and while a child reads the
// device, then puts the source's writes of both overlays onto the device,
// the forks' templates go, and the source, started again, writes to it in
// place.
func TestBlockDisk(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	dev := testLoopDevice(t, 8<<20)
	e := newEnv(t)
	e.boot("src", "--disk", "id=data,file="+dev)
	// Bad input on a block device: refused before anything is made.
	boot := func(name string, disks ...string) []string {
		args := []string{"boot", name, "--kernel", e.guest.Kernel, "--initrd", e.guest.Initrd}
		for _, d := range disks {
			args = append(args, "--disk", d)
		}
		return args
	}
	runBadCases(t, e, []badCase{
		{"block boot disk", boot("b", dev), 2, `disk image "` + dev + `" is a block device: only extra disks may be`},
		{"block disk of another machine", boot("b", e.guest.Disk, "id=data,file="+dev), 2, `block device ` + dev + ` is machine "src"'s disk "data" already`},
	}, func(t *testing.T) {
		if ms := e.list(); len(ms) != 1 {
			t.Errorf("machines after bad input: %v, want only src", ms)
		}
	})
	const data = "/dev/vdb"
	write := func(m, s string) {
		t.Helper()
		e.exec(m, "sh", "-c", "dd if=/dev/zero of="+data+" bs=16 count=1 conv=notrunc 2>/dev/null && printf "+s+" | dd of="+data+" conv=notrunc 2>/dev/null && sync")
	}
	read := func(m string) string {
		t.Helper()
		out := e.exec(m, "sh", "-c", "sync; echo 3 >/proc/sys/vm/drop_caches; dd if="+data+" bs=16 count=1 2>/dev/null | tr -d '\\000'")
		return strings.TrimSpace(out)
	}
	// At 4 KiB, for the writes after a second fork.
	write4k := func(m, s string) {
		t.Helper()
		e.exec(m, "sh", "-c", "printf "+s+" | dd of="+data+" bs=16 seek=256 conv=notrunc 2>/dev/null && sync")
	}
	read4k := func(m string) string {
		t.Helper()
		out := e.exec(m, "sh", "-c", "sync; echo 3 >/proc/sys/vm/drop_caches; dd if="+data+" bs=16 skip=256 count=1 2>/dev/null | tr -d '\\000'")
		return strings.TrimSpace(out)
	}
	write("src", "BEFORE")
	if got := deviceHead(t, dev, 16); got != "BEFORE" {
		t.Errorf("before the fork the device reads %q, want the source's BEFORE written in place", got)
	}

	if out := e.ok("fork", "src", "--dry-run").stdout; !strings.Contains(out, `disk "data": cow, block device `+dev+` frozen in the same pause: it becomes the read-only base`) {
		t.Errorf("fork --dry-run does not say what happens to the block disk:\n%s", out)
	}
	e.ok("fork", "src", "c1", "c2")
	frozen := deviceSum(t, dev)
	for _, c := range []string{"c1", "c2"} {
		if got := read(c); got != "BEFORE" {
			t.Errorf("%s's data disk reads %q, want the source's BEFORE", c, got)
		}
	}
	write("c1", "CHILD1")
	write("src", "AFTER")
	for m, want := range map[string]string{"c1": "CHILD1", "c2": "BEFORE", "src": "AFTER"} {
		if got := read(m); got != want {
			t.Errorf("%s's data disk reads %q, want %q", m, got, want)
		}
	}
	// A second fork freezes the source's overlay, as for a file disk: its
	// writes after it are in a new overlay over that one and the device.
	e.ok("fork", "src", "c3")
	write4k("src", "LATER")
	if got, got4k := read("c3"), read4k("c3"); got != "AFTER" || got4k != "" {
		t.Errorf("c3's data disk reads %q and %q at 4 KiB, want AFTER and nothing", got, got4k)
	}
	if got := deviceSum(t, dev); got != frozen {
		t.Errorf("the device changed after the freeze (sha256 %s, frozen %s)", got, frozen)
	}

	refused := func(says string) {
		t.Helper()
		r := e.vmfork("disk", "commit", "src")
		if r.code != 2 || !strings.Contains(r.stderr, says) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("disk commit: %s; want exit 2 and one line saying %q", r, says)
		}
	}
	refused(`machine is running: stop it first`)
	e.ok("stop", "src")
	refused(`machine "c1" still reads ` + dev)
	e.ok("rm", "-f", "c1", "c2")
	refused(`machine "c3" still reads ` + dev)
	e.ok("rm", "-f", "c3")
	if got := deviceSum(t, dev); got != frozen {
		t.Errorf("the device changed before the commit (sha256 %s, frozen %s)", got, frozen)
	}
	var res []struct {
		ID     string   `json:"id"`
		Device string   `json:"device"`
		Layers []string `json:"layers"`
	}
	r := e.ok("disk", "commit", "src", "--disk", "data", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || len(res) != 1 || res[0].Device != dev || len(res[0].Layers) == 0 {
		t.Fatalf("disk commit --json = %s (%v), want data's overlays committed onto %s", r.stdout, err, dev)
	}
	if got := deviceHead(t, dev, 16); got != "AFTER" {
		t.Errorf("after the commit the device reads %q, want the source's AFTER", got)
	}
	if got := strings.ReplaceAll(string(deviceBytes(t, dev, 4096, 16)), "\x00", ""); got != "LATER" {
		t.Errorf("after the commit the device reads %q at 4 KiB, want the source's LATER", got)
	}
	if len(res[0].Layers) != 2 {
		t.Errorf("committed layers %v, want the source's overlay and the one the second fork froze", res[0].Layers)
	}
	// The forks' templates went with their children and the commit.
	if tpls, _ := filepath.Glob(filepath.Join(e.stateDir, "templates", "*")); len(tpls) != 0 {
		t.Errorf("templates left after the commit: %v", tpls)
	}
	for _, l := range res[0].Layers {
		if _, err := os.Stat(l); err == nil {
			t.Errorf("committed overlay %s is still there", l)
		}
	}
	// Back on the device in place: a write after a cold start lands on it.
	e.ok("start", "src")
	if got, got4k := read("src"), read4k("src"); got != "AFTER" || got4k != "LATER" {
		t.Errorf("after the commit and a start the source reads %q and %q at 4 KiB, want AFTER and LATER", got, got4k)
	}
	write("src", "INPLACE")
	if got := deviceHead(t, dev, 16); got != "INPLACE" {
		t.Errorf("the started source's write reads %q on the device, want INPLACE in place", got)
	}
	e.ok("rm", "-f", "src")
}
