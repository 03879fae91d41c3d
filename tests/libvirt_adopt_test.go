//go:build integration

package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLibvirtAdoptExistingDomain forks a domain an operator defined and
// started with virsh, which vmfork did not boot: vmfork adopts it, its three
// children are ordinary libvirt domains that continue its state, and the
// operator's disk image is frozen for them, never written. Removing the
// children removes the template and leaves the image; vmfork rm of the
// domain itself forgets it, once its owner has merged the overlay vmfork
// moved it onto back into the image.
func TestLibvirtAdoptExistingDomain(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	user := t.TempDir()
	reachableByQEMU(t, filepath.Dir(user))
	disk := userImage(t, d.guest, user)
	p := d.n("web")
	kids := []string{p + "-1", p + "-2", p + "-3"}
	defineDomain(t, p, operatorXML(p, d.guest, disk, sharedFileRAM, noBalloon), true)
	waitAgent(t, p)
	pid := strings.TrimSpace(agentRun(t, p, "/bin/vmfork-counter", "start"))
	time.Sleep(time.Second)
	before, _ := strconv.Atoi(strings.TrimSpace(agentRun(t, p, "/bin/cat", "/run/counter")))

	var res forkJSON
	d.cliJSON(&res, "fork", p, "--count", "3")
	frozen := fileSHA256(t, disk)
	if len(res.Children) != 3 || len(res.Failed) != 0 {
		t.Fatalf("fork = %+v, want three children", res)
	}
	running := strings.Fields(virshOK(t, "list", "--name", "--state-running"))
	for _, n := range append([]string{p}, kids...) {
		if !contains(running, n) {
			t.Errorf("virsh list does not show %s running: %v", n, running)
		}
	}
	for _, k := range kids {
		if got := strings.TrimSpace(d.run(k, "cat", "/run/counter.pid")); got != pid {
			t.Errorf("%s: counter pid %s, want the parent's %s", k, got, pid)
		}
		if c := d.count(k); c < before {
			t.Errorf("%s: counter %d, want it to continue from %d", k, c, before)
		}
	}

	// The record: adopted, by uuid, with the operator's image; the domain
	// now runs on an overlay in its directory, and its persistent
	// definition says so too (libvirt's disk-only snapshot).
	var rec adoptedRecord
	readJSONFile(t, filepath.Join(d.stateDir, "machines", p, "machine.json"), &rec)
	overlay := filepath.Join(d.stateDir, "machines", p, "disk.1.qcow2")
	uuid := strings.TrimSpace(virshOK(t, "domuuid", p))
	if rec.Adopted == nil || rec.Adopted.ID != uuid || rec.Adopted.Disk != disk || rec.Paths.Disk != overlay {
		t.Errorf("record = %+v, want adopted %s with disk %s, now on %s", rec, uuid, disk, overlay)
	}
	for _, inactive := range []bool{false, true} {
		if x := dumpxml(t, p, inactive); !strings.Contains(x, "<source file='"+overlay+"'") {
			t.Errorf("%s's definition (persistent %v) does not name the overlay %s", p, inactive, overlay)
		}
	}
	if got := backingOf(t, overlay); got != disk {
		t.Errorf("the overlay's backing file is %s, want the operator's image %s", got, disk)
	}
	var tpl templateRecord
	readJSONFile(t, filepath.Join(d.stateDir, "templates", res.Template, "manifest.json"), &tpl)
	a, _ := os.Stat(disk)
	if b, err := os.Stat(tpl.Paths.Disk); err != nil || !os.SameFile(a, b) || tpl.ForeignDisk {
		t.Errorf("template disk %s (foreign %v, %v): want a hard link to %s in the template's directory", tpl.Paths.Disk, tpl.ForeignDisk, err, disk)
	}

	// Writes after the fork, in the parent and in a child, never reach the
	// frozen image.
	for _, m := range []string{p, kids[0]} {
		d.run(m, "sh", "-c", "echo "+m+" > /data/after-fork && sync")
	}
	if got := fileSHA256(t, disk); got != frozen {
		t.Errorf("the operator's image changed after the freeze")
	}

	d.cliOK(append([]string{"rm"}, kids...)...)
	running = strings.Fields(virshOK(t, "list", "--name", "--all"))
	for _, k := range kids {
		if contains(running, k) || exists(filepath.Join(d.stateDir, "machines", k)) {
			t.Errorf("%s left after vmfork rm", k)
		}
	}
	if exists(filepath.Join(d.stateDir, "templates", res.Template)) || exists(filepath.Join(d.memDir, res.Template+".ram")) {
		t.Errorf("template %s left after its last child went", res.Template)
	}
	if got := fileSHA256(t, disk); got != frozen || links(t, disk) != 1 {
		t.Errorf("the operator's image after the template went: changed %v, %d links; want unchanged, one link", got != frozen, links(t, disk))
	}
	// Not copied up into the overlay either: the image is still its base.
	if got := backingOf(t, overlay); got != disk {
		t.Errorf("after the template went, the overlay's backing file is %q, want %s", got, disk)
	}
	c := d.count(p)
	time.Sleep(1200 * time.Millisecond)
	if got := d.count(p); got <= c {
		t.Errorf("parent counter stuck at %d", got)
	}

	// rm forgets an adopted domain, but not while it runs on vmfork's
	// overlay: it says how to merge it back, and changes nothing.
	r := d.cli("rm", p)
	if r.code != 1 || !strings.Contains(r.stderr, overlay) || !strings.Contains(r.stderr, "virsh blockcommit "+p+" vda --base "+disk+" --active --pivot") {
		t.Errorf("rm of the adopted domain on vmfork's overlay: %s, want exit 1 and the blockcommit to run", r)
	}
	if !exists(overlay) || !contains(strings.Fields(virshOK(t, "list", "--name", "--state-running")), p) {
		t.Fatalf("a refused rm changed something: overlay there %v", exists(overlay))
	}
	virshOK(t, "blockcommit", p, "vda", "--base", disk, "--active", "--pivot")
	d.cliOK("rm", p)
	if exists(filepath.Join(d.stateDir, "machines", p)) || len(d.machines()) != 0 {
		t.Errorf("%s still recorded after rm: %v", p, d.machines())
	}
	if !contains(strings.Fields(virshOK(t, "list", "--name", "--state-running")), p) {
		t.Errorf("rm stopped the operator's domain %s", p)
	}
	for _, inactive := range []bool{false, true} {
		if x := dumpxml(t, p, inactive); !strings.Contains(x, "<source file='"+disk+"'") {
			t.Errorf("%s's definition (persistent %v) does not name the operator's image after the commit", p, inactive)
		}
	}
	if got := strings.TrimSpace(agentRun(t, p, "/bin/cat", "/data/after-fork")); got != p {
		t.Errorf("the parent's write after the fork reads %q from its own image, want %q", got, p)
	}
	for _, g := range []string{filepath.Join(d.stateDir, "templates", "*"), filepath.Join(d.memDir, "*")} {
		if left, _ := filepath.Glob(g); len(left) != 0 {
			t.Errorf("left: %v", left)
		}
	}
}

// TestLibvirtAdoptImageOnAnotherFileSystem forks an operator's domain whose
// image lies on another file system than the state dir: no hard link can be
// made, so the template records the image where it is. A second fork of the
// same domain freezes vmfork's own overlay. When the children go, both
// templates go, the image stays, unchanged, as the base of the domain's
// disk chain: nothing of it is copied into the state dir.
func TestLibvirtAdoptImageOnAnotherFileSystem(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	shm, err := os.MkdirTemp("/dev/shm", "vmfork-adopt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) }) // after the domain is gone
	if err := os.Chmod(shm, 0o711); err != nil {
		t.Fatal(err)
	}
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	reachableByQEMU(t, filepath.Dir(d.stateDir))
	disk := userImage(t, d.guest, shm)
	p := d.n("db")
	defineDomain(t, p, operatorXML(p, d.guest, disk, sharedFileRAM, noBalloon), true)
	waitAgent(t, p)

	var first, second forkJSON
	d.cliJSON(&first, "fork", p, "--count", "1")
	frozen := fileSHA256(t, disk)
	var tpl templateRecord
	readJSONFile(t, filepath.Join(d.stateDir, "templates", first.Template, "manifest.json"), &tpl)
	if tpl.Paths.Disk != disk || !tpl.ForeignDisk {
		t.Errorf("template disk %s, foreign %v: want the image %s where it is", tpl.Paths.Disk, tpl.ForeignDisk, disk)
	}
	d.run(first.Children[0].Name, "sh", "-c", "echo child > /data/mark && sync")
	d.run(p, "sh", "-c", "echo first > /data/mark && sync")
	d.cliJSON(&second, "fork", p, "--count", "1", "--prefix", p+"-again")
	d.run(p, "sh", "-c", "echo second > /data/mark && sync")
	if got := strings.TrimSpace(d.run(second.Children[0].Name, "cat", "/data/mark")); got != "first" {
		t.Errorf("the second fork's child reads %q, want the parent's disk at that fork", got)
	}

	d.cliOK("rm", first.Children[0].Name, second.Children[0].Name)
	for _, id := range []string{first.Template, second.Template} {
		if exists(filepath.Join(d.stateDir, "templates", id)) {
			t.Errorf("template %s left after its child went", id)
		}
	}
	if got := fileSHA256(t, disk); got != frozen {
		t.Errorf("the operator's image changed after the first freeze")
	}
	var rec adoptedRecord
	readJSONFile(t, filepath.Join(d.stateDir, "machines", p, "machine.json"), &rec)
	if got := backingOf(t, rec.Paths.Disk); got != disk {
		t.Errorf("the domain's top %s reads %q, want the operator's image %s as its base", rec.Paths.Disk, got, disk)
	}
	if got := strings.TrimSpace(d.run(p, "cat", "/data/mark")); got != "second" {
		t.Errorf("the parent reads %q after its templates went, want its own last write", got)
	}
}

// TestLibvirtAdoptUnforkable tries to fork existing domains that cannot be
// forked as they are: the error names the XML element to change or what to
// do, and nothing changes, on the host or in vmfork's state.
func TestLibvirtAdoptUnforkable(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	g := d.guest
	cases := []struct {
		name, xml string
		start     bool
		says      string
	}{
		{"anon", operatorXML(d.n("anon"), g, "", "", noBalloon), true, "<memoryBacking><source type='file'/>"},
		{"balloon", operatorXML(d.n("balloon"), g, "", sharedFileRAM, "<memballoon model='virtio'/>"), true, "<memballoon model='virtio'>"},
		{"off", operatorXML(d.n("off"), g, "", sharedFileRAM, noBalloon), false, "virsh start " + d.n("off")},
	}
	for _, c := range cases {
		defineDomain(t, d.n(c.name), c.xml, c.start)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := d.n(c.name)
			def := dumpxml(t, n, true)
			state := virshOK(t, "domstate", n)
			r := d.cli("fork", n, "--count", "1")
			if r.code != 1 || !strings.Contains(r.stderr, c.says) {
				t.Errorf("fork %s: %s, want exit 1 naming %s", n, r, c.says)
			}
			if exists(filepath.Join(d.stateDir, "machines", n)) || len(d.machines()) != 0 {
				t.Errorf("fork %s left a record: %v", n, d.machines())
			}
			if left, _ := filepath.Glob(filepath.Join(d.stateDir, "templates", "*")); len(left) != 0 {
				t.Errorf("fork %s left templates: %v", n, left)
			}
			if got := dumpxml(t, n, true); got != def {
				t.Errorf("fork %s changed the domain's definition", n)
			}
			if got := virshOK(t, "domstate", n); got != state {
				t.Errorf("fork %s changed the domain's state from %q to %q", n, state, got)
			}
			if info := virshOK(t, "dominfo", n); strings.Contains(info, "tainted") {
				t.Errorf("fork %s tainted the domain: %s", n, info)
			}
		})
	}
}

// TestLibvirtAdoptTwoDisks: an operator's domain with two writable file
// disks forks with no edit: both are frozen in the same snapshot, each
// child's second disk holds what the domain wrote and synced before the
// fork, a child's writes reach neither its sibling nor the domain, and the
// operator's images are never written; a fork with --disk-policy vdb=fresh
// gives its child an empty second disk.
func TestLibvirtAdoptTwoDisks(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	reachableByQEMU(t, filepath.Dir(d.stateDir))
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	disk := userImage(t, d.guest, dir)
	second := filepath.Join(dir, "second.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", second, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	p := d.n("two")
	x := strings.Replace(operatorXML(p, d.guest, disk, sharedFileRAM, noBalloon), "<interface",
		"<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='"+second+"'/><target dev='vdb' bus='virtio'/></disk>\n    <interface", 1)
	defineDomain(t, p, x, true)
	waitAgent(t, p)
	const write = "printf %s | dd of=/dev/vdb conv=notrunc 2>/dev/null && sync"
	const read = "sync; echo 3 >/proc/sys/vm/drop_caches; dd if=/dev/vdb bs=16 count=1 2>/dev/null | tr -d '\\000'"
	agentRun(t, p, "sh", "-c", strings.Replace(write, "%s", "DATA-P", 1))

	var f forkJSON
	d.cliJSON(&f, "fork", p, "--count", "2")
	frozen := fileSHA256(t, second)
	c1, c2 := f.Children[0].Name, f.Children[1].Name
	for _, c := range []string{c1, c2} {
		if got := strings.TrimSpace(d.run(c, "sh", "-c", read)); got != "DATA-P" {
			t.Errorf("%s's second disk reads %q, want the domain's DATA-P", c, got)
		}
	}
	d.run(c1, "sh", "-c", strings.Replace(write, "%s", "DATA-C1", 1))
	for m, want := range map[string]string{c1: "DATA-C1", c2: "DATA-P", p: "DATA-P"} {
		if got := strings.TrimSpace(d.run(m, "sh", "-c", read)); got != want {
			t.Errorf("%s's second disk reads %q after %s wrote to its own, want %q", m, got, c1, want)
		}
	}
	var g forkJSON
	d.cliJSON(&g, "fork", p, "--count", "1", "--prefix", p+"-fresh", "--disk-policy", "vdb=fresh")
	if got := strings.TrimSpace(d.run(g.Children[0].Name, "sh", "-c", read)); got != "" {
		t.Errorf("the fresh fork's child's second disk reads %q, want an empty disk", got)
	}
	// A disk-only fork's children would boot from vmfork's record, which
	// does not hold the operator's domain: refused in one line, before
	// anything is frozen.
	if r := d.cli("fork", p, "--disk-only"); r.code != 2 || !strings.Contains(r.stderr, "cannot hold all of an adopted libvirt domain's definition") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("fork --disk-only of an adopted domain: %s, want exit 2 and one line", r)
	}
	d.cliOK("rm", c1, c2, g.Children[0].Name)
	if got := fileSHA256(t, second); got != frozen {
		t.Errorf("the operator's second image changed after the freeze")
	}
}
