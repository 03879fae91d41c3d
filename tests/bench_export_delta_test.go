//go:build integration

package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkExportDelta compares the offline move of a new golden image as a
// delta archive (template export --base, export_delta.go) with the full
// archive, on BenchmarkPush's guest (VMFORK_PUSH_MEM MiB, 60% filled, then
// VMFORK_PUSH_DELTA MiB of new data kept as golden-v2): host h got golden
// as a full archive ("yesterday"); golden-v2 then goes to h as a full
// archive and as a delta against golden. Two hosts are two state and mem
// dirs here: the archives are files, their copy is not timed (it is their
// size over whatever carries them). Each delta step runs twice: the first
// export cuts both templates into the exporting host's chunk store, the
// first import cuts golden (which came by full archive) into h's.
//
//	VMFORK_BIN=$PWD/bin/vmfork VMFORK_GUEST=/var/cache/vmfork/guest \
//	  go test -tags integration -run '^$' -bench BenchmarkExportDelta -benchtime 1x ./tests/
func BenchmarkExportDelta(b *testing.B) {
	memMiB, deltaMiB := envInt(b, "VMFORK_PUSH_MEM", 2048), envInt(b, "VMFORK_PUSH_DELTA", 64)
	a, h := newEnv(b), newEnv(b)
	fillMiB := bootFilled(b, a, memMiB, deltaMiB)
	a.ok("template", "save", "src", "golden")
	dir := b.TempDir()
	timed := func(e *env, v any, args ...string) float64 {
		start := time.Now()
		e.jsonOK(v, append([]string{"--timeout", "10m"}, args...)...)
		return msSince(start)
	}
	row := func(k string, ms float64, bytes int64) {
		fmt.Printf("%-50s %10.0f ms %10.1f MiB\n", k, ms, mib(bytes))
	}
	fmt.Printf("\ndelta archive vs full archive, test guest %d MiB with %d MiB non-zero, delta %d MiB\n", memMiB, fillMiB, deltaMiB)
	var ex exportJSON
	var im importJSON
	base := filepath.Join(dir, "golden.vmt")
	e0 := timed(a, &ex, "template", "export", "golden", base)
	i0 := timed(h, &im, "template", "import", base)
	row("golden: full archive, export + import", e0+i0, ex.Archive)
	os.Remove(base)

	a.exec("src", "sh", "-c", fmt.Sprintf("head -c %dm /dev/urandom >/fill/delta && sync", deltaMiB))
	a.ok("template", "save", "src", "golden-v2")
	a.ok("rm", "src", "--force") // its RAM would crowd the mem dir

	full := filepath.Join(dir, "golden-v2.vmt")
	e1 := timed(a, &ex, "template", "export", "golden-v2", full)
	i1 := timed(h, &im, "template", "import", full, "--as", "golden-v2-full")
	row("golden-v2: full archive, export", e1, ex.Archive)
	row("golden-v2: full archive, import", i1, 0)
	row("golden-v2: full archive, export + import", e1+i1, ex.Archive)
	h.ok("template", "rm", "golden-v2-full")
	os.Remove(full)

	var dx deltaExportJSON
	for run := 1; run <= 2; run++ {
		file := filepath.Join(dir, fmt.Sprintf("golden-v2-%d.vmd", run))
		e2 := timed(a, &dx, "template", "export", "golden-v2", "--base", "golden", file)
		i2 := timed(h, &im, "template", "import", file)
		what := "golden-v2: delta archive"
		if run == 1 {
			what += " (first: cuts)"
		}
		row(what+", export", e2, dx.Archive)
		row(what+", import", i2, 0)
		row(what+", export + import", e2+i2, dx.Archive)
		fmt.Printf("  (%d of %d chunks carried, %.1f MiB of them)\n", dx.ChunksStored, dx.Chunks, mib(dx.Stored))
		h.ok("template", "rm", "golden-v2")
		os.Remove(file)
		b.ReportMetric(e2+i2, fmt.Sprintf("delta_export_import_%d_ms", run))
	}
	b.ReportMetric(e1+i1, "full_export_import_ms")
	b.ReportMetric(mib(ex.Archive), "full_archive_MiB")
	b.ReportMetric(mib(dx.Archive), "delta_archive_MiB")
}
