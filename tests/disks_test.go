//go:build integration

package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestForkDiskPolicies: a machine with a boot disk and four extra disks,
// one of each policy, forks into three children in one pause. The cow disk
// holds in each child what the source wrote and synced before the fork,
// and a child's writes reach neither its siblings nor the source; the
// shared disk reads the same everywhere and takes no writes; the fresh and
// keep disks are empty in every child, which gets VMFORK_DISK_<ID>=fresh
// in its hooks' environment, and the source's keep disk keeps its data.
// Then one fork overrides a policy (--disk-policy data=shared), and a kept
// template's warm pool serves a child with every disk.
func TestForkDiskPolicies(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	dir := t.TempDir()
	img := func(name string) string {
		p := filepath.Join(dir, name)
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", p, "1M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create %s: %v: %s", p, err, out)
		}
		return p
	}
	shared := filepath.Join(dir, "shared.raw")
	if err := os.WriteFile(shared, append([]byte("SHARED"), make([]byte, 1<<20-6)...), 0o644); err != nil {
		t.Fatal(err)
	}
	e.boot("src",
		"--disk", "id=data,file="+img("data.qcow2"),
		"--disk", "id=ro,file="+shared+",fork=shared",
		"--disk", "id=scratch,file="+img("scratch.qcow2")+",fork=fresh",
		"--disk", "id=home,file="+img("home.qcow2")+",fork=keep")
	// The extra disks follow the boot disk (vda, mounted on /data).
	const data, ro, scratch, home = "/dev/vdb", "/dev/vdc", "/dev/vdd", "/dev/vde"
	write := func(m, dev, s string) {
		t.Helper()
		// Zeros first: a shorter string must not leave a longer one's tail.
		e.exec(m, "sh", "-c", "dd if=/dev/zero of="+dev+" bs=16 count=1 conv=notrunc 2>/dev/null && printf "+s+" | dd of="+dev+" conv=notrunc 2>/dev/null && sync")
	}
	read := func(m, dev string) string {
		t.Helper()
		// From the disk, not the page cache.
		out := e.exec(m, "sh", "-c", "sync; echo 3 >/proc/sys/vm/drop_caches; dd if="+dev+" bs=16 count=1 2>/dev/null | tr -d '\\000'")
		return strings.TrimSpace(out)
	}
	write("src", data, "DATA-SRC")
	write("src", scratch, "SCRATCH-SRC")
	write("src", home, "HOME-SRC")
	if r := e.vmfork("exec", "src", "--", "sh", "-c", "printf X | dd of="+ro+" conv=notrunc"); r.code == 0 {
		t.Errorf("the source wrote to its shared disk: %s", r)
	}

	if out := e.ok("fork", "src", "--dry-run", "--disk-policy", "scratch=cow").stdout; !strings.Contains(out, `disk "scratch": cow, frozen in the same pause`) || !strings.Contains(out, `disk "home": keep`) {
		t.Errorf("fork --dry-run does not say per disk what happens:\n%s", out)
	}
	hook := filepath.Join(dir, "disk-env.sh")
	if err := os.WriteFile(hook, []byte("env | grep '^VMFORK_DISK_' | sort >/tmp/disk-env\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.ok("fork", "src", "c1", "c2", "c3", "--extra-step", "vmforktest.disks="+hook)
	for _, c := range []string{"c1", "c2", "c3"} {
		if got := read(c, data); got != "DATA-SRC" {
			t.Errorf("%s's cow disk reads %q, want the source's DATA-SRC", c, got)
		}
		if got := read(c, ro); got != "SHARED" {
			t.Errorf("%s's shared disk reads %q, want SHARED", c, got)
		}
		for _, dev := range []string{scratch, home} {
			if got := read(c, dev); got != "" {
				t.Errorf("%s's %s reads %q, want an empty disk", c, dev, got)
			}
		}
		if got := strings.Fields(e.exec(c, "cat", "/tmp/disk-env")); strings.Join(got, " ") != "VMFORK_DISK_HOME=fresh VMFORK_DISK_SCRATCH=fresh" {
			t.Errorf("%s's hooks saw %q, want VMFORK_DISK_HOME=fresh VMFORK_DISK_SCRATCH=fresh", c, got)
		}
	}
	write("c1", data, "DATA-C1")
	write("c1", home, "HOME-C1")
	if r := e.vmfork("exec", "c2", "--", "sh", "-c", "printf X | dd of="+ro+" conv=notrunc"); r.code == 0 {
		t.Errorf("a child wrote to the shared disk: %s", r)
	}
	for m, want := range map[string]string{"c2": "DATA-SRC", "src": "DATA-SRC", "c1": "DATA-C1"} {
		if got := read(m, data); got != want {
			t.Errorf("%s's cow disk reads %q after c1 wrote to its own, want %q", m, got, want)
		}
	}
	if got := read("src", home); got != "HOME-SRC" {
		t.Errorf("the source's keep disk reads %q, want HOME-SRC", got)
	}
	if got := read("src", scratch); got != "SCRATCH-SRC" {
		t.Errorf("the source's fresh disk reads %q, want SCRATCH-SRC", got)
	}
	for _, c := range []string{"c1", "c2", "c3"} {
		e.ok("rm", "-f", c)
	}

	// One fork shares the cow disk: the child reads the source's data
	// frozen in this pause and cannot change it.
	write("src", data, "DATA-SRC2")
	e.ok("fork", "src", "s1", "--disk-policy", "data=shared")
	if got := read("s1", data); got != "DATA-SRC2" {
		t.Errorf("s1's shared data disk reads %q, want DATA-SRC2", got)
	}
	// Direct, so that a refused write leaves no dirty page in the cache.
	if r := e.vmfork("exec", "s1", "--", "sh", "-c", "dd if=/dev/zero of="+data+" bs=4096 count=1 oflag=direct"); r.code == 0 {
		t.Errorf("s1 wrote to its shared data disk: %s", r)
	}
	if got := read("s1", data); got != "DATA-SRC2" {
		t.Errorf("s1's shared data disk reads %q after a write, want DATA-SRC2", got)
	}
	if got := read("src", data); got != "DATA-SRC2" {
		t.Errorf("the source's data disk reads %q, want DATA-SRC2", got)
	}
	e.ok("rm", "-f", "s1")

	// A kept template's warm pool: its member starts with every disk by
	// its policy, and the child that takes it reads them as the cold one
	// does; their cow disks stay their own.
	e.ok("template", "save", "src", "golden", "--pool", "1")
	pool := e.poolPIDs()
	var res forkJSON
	e.jsonOK(&res, "fork", "golden", "--count", "2")
	var pooled, cold []string
	for _, c := range res.Children {
		if slices.Contains(pool, c.PID) {
			pooled = append(pooled, c.Name)
		} else {
			cold = append(cold, c.Name)
		}
		for dev, want := range map[string]string{data: "DATA-SRC2", ro: "SHARED", scratch: "", home: ""} {
			if got := read(c.Name, dev); got != want {
				t.Errorf("%s (pool %v) %s reads %q, want %q", c.Name, pool, dev, got, want)
			}
		}
	}
	if len(pooled) != 1 || len(cold) != 1 {
		t.Fatalf("children %+v from the pool's processes %v: want one of each", res.Children, pool)
	}
	write(pooled[0], data, "DATA-POOLED")
	if got := read(cold[0], data); got != "DATA-SRC2" {
		t.Errorf("the cold child's cow disk reads %q after the pooled one wrote to its own, want DATA-SRC2", got)
	}
	if got := read(pooled[0], data); got != "DATA-POOLED" {
		t.Errorf("the pooled child's cow disk reads %q, want its DATA-POOLED", got)
	}
	e.ok("rm", "-f", pooled[0], cold[0])
	e.ok("template", "rm", "golden")

	// A rewind takes every disk back to the checkpoint but the keep disk,
	// which stays the machine's own as it is.
	e.ok("checkpoint", "src", "--as", "cp1")
	write("src", data, "DATA-LATER")
	write("src", home, "HOME-LATER")
	e.ok("rewind", "src", "--to", "cp1")
	if got := read("src", data); got != "DATA-SRC2" {
		t.Errorf("after the rewind the cow disk reads %q, want the checkpoint's DATA-SRC2", got)
	}
	if got := read("src", home); got != "HOME-LATER" {
		t.Errorf("after the rewind the keep disk reads %q, want HOME-LATER, untouched", got)
	}
	if got := read("src", ro); got != "SHARED" {
		t.Errorf("after the rewind the shared disk reads %q, want SHARED", got)
	}

	// Hibernate and resume: every disk goes on as it was, a fresh one too.
	write("src", data, "DATA-H")
	write("src", scratch, "SCRATCH-H")
	e.ok("hibernate", "src")
	e.ok("resume", "src")
	for dev, want := range map[string]string{data: "DATA-H", scratch: "SCRATCH-H", home: "HOME-LATER", ro: "SHARED"} {
		if got := read("src", dev); got != want {
			t.Errorf("after hibernate and resume %s reads %q, want %q", dev, got, want)
		}
	}
}
