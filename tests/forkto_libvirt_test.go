//go:build integration

package tests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestLibvirtForkTo (issue 24 item 2, the libvirt half): `fork SOURCE --to
// HOST` on the libvirt driver between the rig's two hosts, host a on this
// machine's libvirtd, host b on a libvirtd of its own
// (hosts_libvirt_test.go), both ends with --connect qemu:///system (host
// b's sessions get it from LIBVIRT_DEFAULT_URI):
//   - the link cut during postcopy (the child runs on b, its RAM still
//     streaming at 2 MiB/s): the command fails, host b has no machine, no
//     domain, no QEMU, no kept template; host a the source alone, running,
//     and no loaded domain;
//   - vmfork killed during postcopy: the same, the loaded domain gone
//     within 10 s;
//   - a fork --to that completes (auto takes the live path): the child is
//     a domain of host b's libvirtd, continues the source's process (the
//     counter's PID, a write never synced), READY with its own hostname;
//     the source still runs;
//   - host b's vmfork without --connect: refused in one line naming the
//     driver, nothing left;
//   - one on the copy path (--to-mode copy): a domain of b's libvirtd too.
func TestLibvirtForkTo(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	const uri = "LIBVIRT_DEFAULT_URI=" + libvirtURI
	r := newHostRigWith(t, hostRigOptions{libvirtB: true}, uri, uri)
	ra, rb := r.hosts[0], r.hosts[1]
	a, b := ra.withEnv(uri), rb.withEnv(uri)
	libvirtSetup(t, a)
	// Domain names are host-wide on host a's libvirtd (this machine's).
	sum := sha256.Sum256([]byte(a.stateDir))
	src := "t" + hex.EncodeToString(sum[:3]) + "-src"
	t.Cleanup(func() { removeDomains(t, src) })
	loadedDomains := func() []string { return domains(t, "vmfork-loaded-") }
	before := loadedDomains()

	t0 := time.Now()
	phase := func(what string) { t.Logf("%.1f s: %s", time.Since(t0).Seconds(), what) }
	a.boot(src)
	phase("source booted")
	pid := strings.TrimSpace(a.exec(src, "vmfork-counter", "start"))
	// Never synced: it lives in the guest's page cache, i.e. in its RAM.
	a.exec(src, "sh", "-c", "echo unsynced > /data/unsynced")

	nothingLeft := func(when string) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for forkServes(b.stateDir) > 0 || len(b.list()) > 0 || len(rb.domains()) > 0 || len(b.qemuProcesses()) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: host b still has machines %v, domains %v, QEMU %v", when, b.list(), rb.domains(), b.qemuProcesses())
			}
			time.Sleep(time.Second)
		}
		b.ok("gc")
		b.storeIsEmpty(when)
		if r := a.vmfork("template", "ls", "--json"); strings.Contains(r.stdout, `"fork-to-`) {
			t.Errorf("%s: host a keeps a fork's template: %s", when, r.stdout)
		}
		if ms := a.list(); len(ms) != 1 || ms[0].Name != src || ms[0].State != "running" {
			t.Errorf("%s: host a has %+v, want %s running alone", when, ms, src)
		}
		if ls := loadedDomains(); len(ls) > len(before) {
			t.Errorf("%s: host a still runs loaded domains %v", when, ls)
		}
		a.counterAdvances(src)
	}

	// The link cut during postcopy (TestForkTo's last cut point): the
	// child's record on b has its QEMU's PID, then 2 s more of RAM at
	// 2 MiB/s.
	childRuns := func() bool {
		data, _ := os.ReadFile(filepath.Join(b.stateDir, "machines", "kid", "machine.json"))
		if !bytes.Contains(data, []byte(`"pid":`)) {
			return false
		}
		time.Sleep(2 * time.Second)
		return true
	}
	args := append([]string{"--connect", libvirtURI, "fork", src, "kid", "--to", rb.addr, "--to-mode", "postcopy", "--postcopy-bandwidth", "2097152"}, r.transfer()...)
	res := a.cutSSH(t, "fork-serve", childRuns, args...)
	if res.code == 0 {
		t.Errorf("fork --to with the link cut during postcopy: %s, want a failure", res)
	} else {
		lines := strings.Split(strings.TrimSpace(res.stderr), "\n")
		t.Logf("link cut during postcopy: exit %d: %s", res.code, lines[len(lines)-1])
		if !strings.Contains(res.stderr, "(migration postcopy-paused)") {
			t.Errorf("link cut during postcopy: the error does not say the migration was postcopy-paused: %s", lines[len(lines)-1])
		}
	}
	phase("link cut: fork failed")
	nothingLeft("the link cut during postcopy")
	phase("link cut: nothing left")

	// vmfork itself killed during postcopy: the loaded domain here dies
	// with it (libvirtd destroys it when vmfork's connection closes:
	// START_AUTODESTROY), so the migration through ssh's forward ends, and
	// the other host undoes its child as for a cut link. The fork's
	// template here stays kept under its fork-to name (gc gives it up
	// after ForkToOrphanAfter): removed by hand.
	killed, _ := a.cutAt(t, "fork-serve", childRuns, true, args...)
	if killed.code == 0 {
		t.Errorf("fork --to with vmfork killed during postcopy: %s, want a failure", killed)
	}
	if !eventually(10*time.Second, func() bool { return len(loadedDomains()) <= len(before) }) {
		t.Errorf("vmfork killed: its loaded domain still runs: %v", loadedDomains())
	}
	var kept []struct {
		Name string `json:"name"`
	}
	a.jsonOK(&kept, "template", "ls")
	for _, k := range kept {
		if strings.HasPrefix(k.Name, "fork-to-") {
			a.ok("template", "rm", k.Name)
		}
	}
	phase("vmfork killed")
	nothingLeft("vmfork killed during postcopy")
	phase("vmfork killed: nothing left")

	before2 := a.counter(src)
	var fr forkToJSON
	a.jsonOK(&fr, append([]string{"fork", src, "--to", rb.addr, "kid", "--hostname", "kid-on-b"}, r.transfer()...)...)
	t.Logf("libvirt fork --to (%s): source paused %.1f ms; freeze %.0f ms, push done %.0f ms (%.1f MiB), loaded %.0f ms, child running %.0f ms, ready %.0f ms, all %.0f ms; migration %+v",
		fr.Mode, fr.PauseMS, fr.FreezeMS, fr.PushMS, mib(fr.Push.BytesOut), fr.LoadedMS, fr.RunningMS, fr.ReadyMS, fr.Elapsed, fr.Migration)
	if fr.Mode != "postcopy" || fr.Migration == nil || fr.Migration.Status != "completed" {
		t.Errorf("libvirt fork --to of one child took mode %q (migration %+v), want the live path, completed", fr.Mode, fr.Migration)
	}
	if fr.Fork == nil || len(fr.Fork.Children) != 1 || fr.Fork.Children[0].Name != "kid" {
		t.Fatalf("fork --to = %+v, want child kid", fr)
	}
	if ds := rb.domains(); !slices.Contains(ds, "kid") {
		t.Errorf("host b's libvirtd runs %v, want domain kid", ds)
	}
	// libvirt did not start the migration: its view of the child must
	// still be a running domain.
	if st, err := rb.virsh("domstate", "kid", "--reason"); err != nil || !strings.HasPrefix(strings.TrimSpace(st), "running") {
		t.Errorf("host b's libvirtd: domain kid is %q (%v), want running", strings.TrimSpace(st), err)
	} else {
		t.Logf("host b's libvirtd: kid %s", strings.TrimSpace(st))
	}
	if ms := b.list(); len(ms) != 1 || ms[0].Name != "kid" || ms[0].State != "running" {
		t.Errorf("host b has %+v, want kid running", ms)
	}
	if got := strings.TrimSpace(b.exec("kid", "cat", "/run/counter.pid")); got != pid {
		t.Errorf("kid on host b: counter PID %s, want the source's %s", got, pid)
	}
	if n := b.counter("kid"); n < before2 {
		t.Errorf("kid on host b: counter %d, want it to go on from %d", n, before2)
	}
	if got := b.exec("kid", "cat", "/data/unsynced"); got != "unsynced\n" {
		t.Errorf("kid on host b: the unsynced write reads %q", got)
	}
	if got := strings.TrimSpace(b.exec("kid", "hostname")); got != "kid-on-b" {
		t.Errorf("kid on host b: hostname %q, want its own, kid-on-b", got)
	}
	if ls := loadedDomains(); len(ls) > len(before) {
		t.Errorf("host a still runs loaded domains %v", ls)
	}
	a.counterAdvances(src)
	b.ok("rm", "kid", "--force")
	phase("fork --to checked")

	// HOST's vmfork without --connect (no LIBVIRT_DEFAULT_URI there): the
	// fork is refused in one line naming the driver, and leaves nothing.
	noURI := append([]string{"fork", src, "--to", rb.addr, "kid4"}, r.transfer("env", "-u", "LIBVIRT_DEFAULT_URI")...)
	if res := a.vmfork(noURI...); res.code == 0 {
		t.Errorf("fork --to a host whose vmfork runs the embedded driver: %s, want a refusal", res)
	} else {
		lines := strings.Split(strings.TrimSpace(res.stderr), "\n")
		t.Logf("fork --to a host without --connect: exit %d: %s", res.code, lines[len(lines)-1])
		if !strings.Contains(lines[len(lines)-1], `"libvirt"`) {
			t.Errorf("fork --to a host without --connect: the error does not name the driver: %s", res.stderr)
		}
	}
	nothingLeft("fork --to a host without --connect")
	phase("host without --connect refused")

	// The copy path on libvirt (the whole template pushed, its domain XML
	// with it, forked there).
	var cp forkToJSON
	a.jsonOK(&cp, append([]string{"fork", src, "--to", rb.addr, "kid3", "--to-mode", "copy"}, r.transfer()...)...)
	t.Logf("libvirt fork --to (copy): source paused %.1f ms; push done %.0f ms (%.1f MiB), child running %.0f ms, ready %.0f ms",
		cp.PauseMS, cp.PushMS, mib(cp.Push.BytesOut), cp.RunningMS, cp.ReadyMS)
	if cp.Mode != "copy" || cp.Fork == nil || len(cp.Fork.Children) != 1 {
		t.Errorf("libvirt fork --to --to-mode copy = %+v", cp)
	}
	if ds := rb.domains(); !slices.Contains(ds, "kid3") {
		t.Errorf("host b's libvirtd runs %v, want domain kid3", ds)
	}
	if got := strings.TrimSpace(b.exec("kid3", "cat", "/run/counter.pid")); got != pid {
		t.Errorf("kid3 on host b: counter PID %s, want the source's %s", got, pid)
	}
	b.ok("rm", "kid3", "--force")
	phase("copy path checked")

	// Against a local libvirt fork (logged, not asserted).
	var local forkJSON
	a.jsonOK(&local, "fork", src, src+"-kid")
	if len(local.Children) == 1 {
		t.Logf("local libvirt fork: source paused %.1f ms, child running %.0f ms, ready %.0f ms (fork --to: paused %.1f ms, running %.0f ms, ready %.0f ms)",
			local.PauseMS, local.Children[0].RunningMS, local.Children[0].ReadyMS, fr.PauseMS, fr.RunningMS, fr.ReadyMS)
	}
	a.ok("rm", src+"-kid", "--force")
}
