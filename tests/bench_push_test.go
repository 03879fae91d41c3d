//go:build integration

package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// BenchmarkPush compares template push (chunks.go, transfer.go) with the
// whole-archive path, export + copy (scp over the same SSH link) + import,
// between the two simulated hosts of hosts_test.go: a test guest of
// VMFORK_PUSH_MEM MiB (default 2048) holding 60% of its RAM in non-zero
// data (BenchmarkExportImport's fill, but each 32 MiB copy of the random
// block rotated by 8 more bytes, so that no two pages are alike: a repeated
// block would be sent once, as chunks that recur), kept as a template and sent to an
// empty host (fresh); then the guest writes VMFORK_PUSH_DELTA MiB (default
// 64) of new data, is kept again, and the second template goes both ways
// to the host that has the first (delta). Each push runs twice, chunks
// raw (--no-compress) and zstd-compressed where that pays, the receiver
// giving the template up (and gc its chunks) in between.
// VMFORK_PUSH_FILL=text fills with od(1)'s hex of random bytes (zstd keeps
// about 40% of it) instead of random bytes (it keeps all).
//
//	VMFORK_BIN=$PWD/bin/vmfork VMFORK_GUEST=/var/cache/vmfork/guest \
//	  go test -tags integration -run '^$' -bench BenchmarkPush -benchtime 1x ./tests/
func BenchmarkPush(b *testing.B) {
	memMiB, deltaMiB := envInt(b, "VMFORK_PUSH_MEM", 2048), envInt(b, "VMFORK_PUSH_DELTA", 64)
	r := newHostRig(b)
	a, h := r.hosts[0], r.hosts[1]
	fillMiB := bootFilled(b, a.env, memMiB, deltaMiB)
	a.ok("template", "save", "src", "golden")

	dir := b.TempDir()
	wholePath := func(name string) (exp, cp, imp float64, size, stored int64) {
		file := filepath.Join(dir, name+".vmt")
		start := time.Now()
		var ex exportJSON
		a.jsonOK(&ex, "--timeout", "10m", "template", "export", name, file)
		exp = msSince(start)
		start = time.Now()
		dst := filepath.Join(dir, name+"-copied.vmt")
		out, err := exec.Command("ip", "netns", "exec", a.ns, "scp", "-q", "-F", r.sshCF, file, h.addr+":"+dst).CombinedOutput()
		if err != nil {
			b.Fatalf("scp %s: %v: %s", file, err, out)
		}
		cp = msSince(start)
		start = time.Now()
		h.ok("--timeout", "10m", "template", "import", dst, "--as", name+"-imported")
		imp = msSince(start)
		// The import was only timed: its RAM would hold the mem dir.
		h.ok("template", "rm", name+"-imported")
		h.ok("gc")
		os.Remove(dst)
		os.Remove(file)
		return exp, cp, imp, ex.Archive, ex.Stored
	}
	// push sends name raw, then compressed, the receiver giving the first
	// copy up in between; it returns each and its time less the sender's
	// cut (the first push of a template cuts it into the store).
	push := func(name string) (raw, z transferJSON, rawMS, zMS float64) {
		one := func(flags ...string) (transferJSON, float64) {
			start := time.Now()
			var p transferJSON
			a.jsonOK(&p, append(append([]string{"template", "push", name, h.addr}, flags...), r.transfer()...)...)
			ms := msSince(start)
			fmt.Printf("  (%s %v: %.0f ms, cut %.0f ms, receiver's build %.0f ms, %d of %d chunks, codec %q)\n", name, flags, ms, p.CutMS, p.Received.BuildMS, p.Received.ChunksSent, p.Received.Chunks, p.Codec)
			return p, ms - p.CutMS
		}
		raw, rawMS = one("--no-compress")
		h.ok("template", "rm", name)
		h.ok("gc")
		z, zMS = one()
		return raw, z, rawMS, zMS
	}
	row := func(k string, ms float64, bytes int64) {
		fmt.Printf("%-46s %10.0f ms %10.1f MiB\n", k, ms, mib(bytes))
	}
	fmt.Printf("\npush vs export + scp + import, test guest %d MiB with %d MiB non-zero, delta %d MiB\n", memMiB, fillMiB, deltaMiB)
	e1, c1, i1, s1, s1Stored := wholePath("golden")
	row("fresh: export", e1, 0)
	row("fresh: scp (archive)", c1, s1)
	row("fresh: import", i1, 0)
	row("fresh: export + scp + import", e1+c1+i1, s1)
	p1, z1, t1, tz1 := push("golden")
	row("fresh: push raw, less the cut (bytes out)", t1, p1.BytesOut)
	row("fresh: push zstd, less the cut (bytes out)", tz1, z1.BytesOut)
	row("fresh: the sender's cut", p1.CutMS, 0)
	fmt.Printf("fresh: archive stored %.1f MiB, chunks %.1f MiB in %d distinct chunks\n", mib(s1Stored), mib(p1.Received.Stored), p1.Received.Chunks)

	a.exec("src", "sh", "-c", fmt.Sprintf("head -c %dm /dev/urandom >/fill/delta && sync", deltaMiB))
	a.ok("template", "save", "src", "golden-v2")
	p2, z2, t2, tz2 := push("golden-v2")
	row("delta: push raw, less the cut (bytes out)", t2, p2.BytesOut)
	row("delta: push zstd, less the cut (bytes out)", tz2, z2.BytesOut)
	row("delta: the sender's cut", p2.CutMS, 0)
	row("delta: push (bytes in: page hashes)", 0, p2.BytesIn)
	pages, _ := a.differing(templateID(b, a.env, "golden"), templateID(b, a.env, "golden-v2"))
	row("delta: pages that differ", 0, pages)
	e2, c2, i2, s2, _ := wholePath("golden-v2")
	row("delta: export + scp + import", e2+c2+i2, s2)
	b.ReportMetric(t1, "push_fresh_ms")
	b.ReportMetric(e1+c1+i1, "export_copy_import_ms")
	b.ReportMetric(t2, "push_delta_ms")
	b.ReportMetric(mib(p2.BytesOut), "push_delta_MiB")
	b.ReportMetric(tz1, "push_fresh_zstd_ms")
	b.ReportMetric(tz2, "push_delta_zstd_ms")
	b.ReportMetric(mib(z2.BytesOut), "push_delta_zstd_MiB")
}

// bootFilled boots machine src on a with memMiB of RAM, 60% of it filled
// as BenchmarkPush says (room left for deltaMiB more), and returns the
// MiB filled.
func bootFilled(b *testing.B, a *env, memMiB, deltaMiB int) int {
	gen := "head -c %dm /dev/urandom"
	if os.Getenv("VMFORK_PUSH_FILL") == "text" {
		gen = "head -c $((%d * 16 / 48 + 1))m /dev/urandom | od -An -tx1"
	}
	const fillChunk = 32
	fillMiB := memMiB * 60 / 100 / fillChunk * fillChunk
	a.boot("src", "--memory", strconv.Itoa(memMiB)+"M")
	script := fmt.Sprintf(`set -e
mkdir -p /fill && mount -t tmpfs -o size=%dm vmfork-fill /fill
%s | head -c %dm >/fill/chunk
i=1; while [ $i -le %d ]; do { tail -c +$((i * 8 + 1)) /fill/chunk; head -c $((i * 8)) /fill/chunk; } >>/fill/data; i=$((i + 1)); done
rm /fill/chunk && sync`, fillMiB+fillChunk+deltaMiB+1, fmt.Sprintf(gen, fillChunk), fillChunk, fillMiB/fillChunk)
	if r := a.vmfork("--timeout", "10m", "exec", "src", "--", "sh", "-c", script); r.code != 0 {
		b.Fatalf("fill the guest: %s", r)
	}
	return fillMiB
}

func envInt(b testing.TB, name string, def int) int {
	if s := os.Getenv(name); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q: want a positive number", name, s)
		}
		return n
	}
	return def
}
