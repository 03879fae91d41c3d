//go:build integration

package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkForkTo (issue 24's Done-when, docs/TEMPLATES.md): fork --to's
// live path (postcopy) against the whole-archive path (template save +
// export + scp + import + fork on the other host) and against a local
// fork (at the same place in the source's life: see below), between the two simulated hosts of hosts_test.go, with a test
// guest of VMFORK_FORKTO_MEM MiB (default 2048) holding 65% of its RAM in
// non-zero data (BenchmarkPush's fill) and its counter running. Times to
// RUNNING and READY are from the command's start (the archive path's sums
// its commands' times); pauses are the source's. Host b holds nothing of
// the guest before: the disk layers travel whole too.
//
//	VMFORK_BIN=$PWD/bin/vmfork VMFORK_GUEST=/var/cache/vmfork/guest \
//	  go test -tags integration -run '^$' -bench BenchmarkForkTo -benchtime 1x ./tests/
func BenchmarkForkTo(b *testing.B) {
	memMiB := envInt(b, "VMFORK_FORKTO_MEM", 2048)
	const fillChunk = 32
	fillMiB := memMiB * 65 / 100 / fillChunk * fillChunk
	r := newHostRig(b)
	a, h := r.hosts[0], r.hosts[1]
	a.boot("src", "--memory", strconv.Itoa(memMiB)+"M")
	script := fmt.Sprintf(`set -e
mkdir -p /fill && mount -t tmpfs -o size=%dm vmfork-fill /fill
head -c %dm /dev/urandom >/fill/chunk
i=1; while [ $i -le %d ]; do { tail -c +$((i * 8 + 1)) /fill/chunk; head -c $((i * 8)) /fill/chunk; } >>/fill/data; i=$((i + 1)); done
rm /fill/chunk && sync`, fillMiB+fillChunk+1, fillChunk, fillMiB/fillChunk)
	if r := a.vmfork("--timeout", "10m", "exec", "src", "--", "sh", "-c", script); r.code != 0 {
		b.Fatalf("fill the guest: %s", r)
	}
	pid := strings.TrimSpace(a.exec("src", "vmfork-counter", "start"))

	// Pauses compared at the same place in the source's life. The first
	// freeze of a machine maps its own file and copies nothing (ram_mode
	// first); every later one is a delta on that file. So a first local
	// fork is shown on its own, then fork --to and a local fork alternate
	// (VMFORK_FORKTO_ROUNDS pairs, the order swapped each round so neither
	// always comes later): the ratio is theirs.
	var first forkJSON
	a.jsonOK(&first, "--timeout", "10m", "fork", "src", "local-kid")
	a.ok("rm", "local-kid", "--force")
	rounds := envInt(b, "VMFORK_FORKTO_ROUNDS", 2)
	var lives []forkToJSON
	var locals []forkJSON
	forkTo := func(k int) {
		var live forkToJSON
		kid := fmt.Sprintf("kid%d", k)
		a.jsonOK(&live, append([]string{"--timeout", "10m", "fork", "src", kid, "--to", h.addr, "--to-mode", "postcopy", "--hostname", kid + "-on-b"}, r.transfer()...)...)
		if got := strings.TrimSpace(h.exec(kid, "cat", "/run/counter.pid")); got != pid {
			b.Errorf("%s on host b: counter PID %s, want the source's %s", kid, got, pid)
		}
		h.ok("rm", kid, "--force")
		h.ok("gc")
		lives = append(lives, live)
	}
	forkLocal := func(k int) {
		var local forkJSON
		a.jsonOK(&local, "--timeout", "10m", "fork", "src", fmt.Sprintf("local%d", k))
		a.ok("rm", fmt.Sprintf("local%d", k), "--force")
		locals = append(locals, local)
	}
	for k := 1; k <= rounds; k++ {
		if k%2 == 1 {
			forkTo(k)
			forkLocal(k)
		} else {
			forkLocal(k)
			forkTo(k)
		}
	}
	live := lives[0]

	// The archive path: save, export, scp, import, fork there.
	dir := b.TempDir()
	file := filepath.Join(dir, "golden.vmt")
	start := time.Now()
	var saved struct {
		PauseMS float64 `json:"pause_ms"`
	}
	a.jsonOK(&saved, "template", "save", "src", "golden", "--json")
	saveMS := msSince(start)
	t0 := time.Now()
	a.ok("--timeout", "10m", "template", "export", "golden", file)
	exportMS := msSince(t0)
	t0 = time.Now()
	dst := filepath.Join(dir, "golden-copied.vmt")
	if out, err := exec.Command("ip", "netns", "exec", a.ns, "scp", "-q", "-F", r.sshCF, file, h.addr+":"+dst).CombinedOutput(); err != nil {
		b.Fatalf("scp %s: %v: %s", file, err, out)
	}
	copyMS := msSince(t0)
	os.Remove(file)
	t0 = time.Now()
	h.ok("--timeout", "10m", "template", "import", dst, "--as", "golden")
	importMS := msSince(t0)
	os.Remove(dst)
	base := msSince(start)
	var f forkJSON
	h.jsonOK(&f, "fork", "golden", "kid2", "--hostname", "kid2-on-b")
	if len(f.Children) != 1 {
		b.Fatalf("fork on b: %+v", f)
	}
	h.ok("rm", "kid2", "--force")
	h.ok("template", "rm", "golden")
	a.ok("template", "rm", "golden")

	fmt.Printf("\nfork --to vs save + export + scp + import + fork, test guest %d MiB with %d MiB non-zero, counter running\n", memMiB, fillMiB)
	fmt.Printf("%-34s %12s %12s %12s\n", "", "pause ms", "RUNNING ms", "READY ms")
	fc := first.Children[0]
	fmt.Printf("%-34s %12.1f %12.0f %12.0f\n", "local fork (the first freeze)", first.PauseMS, fc.RunningMS, fc.ReadyMS)
	var livePause, localPause float64
	for k := range lives {
		lc, l := locals[k].Children[0], lives[k]
		fmt.Printf("%-34s %12.1f %12.0f %12.0f\n", fmt.Sprintf("local fork, round %d", k+1), locals[k].PauseMS, lc.RunningMS, lc.ReadyMS)
		fmt.Printf("%-34s %12.1f %12.0f %12.0f\n", fmt.Sprintf("fork --to (postcopy), round %d", k+1), l.PauseMS, l.RunningMS, l.ReadyMS)
		livePause += l.PauseMS
		localPause += locals[k].PauseMS
	}
	fmt.Printf("%-34s %12.1f %12.0f %12.0f\n", "save+export+scp+import+fork", saved.PauseMS, base+f.Children[0].RunningMS, base+f.Children[0].ReadyMS)
	fmt.Printf("  live (round 1): freeze %.0f ms, disks pushed %.0f ms (%.1f MiB), loaded QEMU ready %.0f ms; migration %.1f MiB, switchover %.0f ms after migrate, all RAM there %.0f ms after migrate; command %.0f ms\n",
		live.FreezeMS, live.PushMS, mib(live.Push.BytesOut), live.LoadedMS, mib(live.Migration.Bytes), live.Migration.SwitchoverMS, live.Migration.TotalMS, live.Elapsed)
	fmt.Printf("  archive: save %.0f, export %.0f, scp %.0f, import %.0f ms\n", saveMS, exportMS, copyMS, importMS)
	fmt.Printf("  RUNNING %.1fx sooner, READY %.1fx sooner than the archive path (round 1); pause %.2fx a local fork's at the same place (mean of %d rounds), %.2fx a first freeze's\n",
		(base+f.Children[0].RunningMS)/live.RunningMS, (base+f.Children[0].ReadyMS)/live.ReadyMS, livePause/localPause, len(lives), livePause/float64(len(lives))/first.PauseMS)
}
