//go:build integration

package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkExportImport keeps a template of a 2 GiB test guest holding 60%
// of its RAM in non-zero data, exports it to one archive and imports it
// under a second "host" (another state and mem dir), then forks the import
// to READY to show it works. It reports the archive against what it must
// hold (the RAM the guest uses, MemTotal - MemFree, plus the template's disk
// layer), the export
// and import times, and the RAM file's logical size.
//
// The data is 32 MiB from the guest's /dev/urandom, repeated: zstd's window
// at vmfork's level is 8 MiB, so a repeat is too far back to be found, and
// the data compresses as badly as a desktop's would at worst. urandom for
// the whole 1.2 GiB would take minutes under TCG.
//
//	VMFORK_BIN=$PWD/bin/vmfork VMFORK_GUEST=/var/cache/vmfork/guest \
//	  go test -tags integration -run '^$' -bench BenchmarkExportImport -benchtime 1x ./tests/
func BenchmarkExportImport(b *testing.B) {
	const memMiB, chunkMiB = 2048, 32
	fillMiB := memMiB * 60 / 100 / chunkMiB * chunkMiB
	e := newEnv(b)
	e.boot("src", "--memory", strconv.Itoa(memMiB)+"M")
	script := fmt.Sprintf(`set -e
mkdir -p /fill && mount -t tmpfs -o size=%dm vmfork-fill /fill
head -c %dm /dev/urandom >/fill/chunk
i=1; set --; while [ $i -le %d ]; do set -- "$@" /fill/chunk; i=$((i + 1)); done
cat "$@" >/fill/data && rm /fill/chunk && sync`, fillMiB+chunkMiB+1, chunkMiB, fillMiB/chunkMiB)
	start := time.Now()
	if r := e.vmfork("--timeout", "10m", "exec", "src", "--", "sh", "-c", script); r.code != 0 {
		b.Fatalf("fill the guest: %s", r)
	}
	b.Logf("filled %d MiB in the guest in %v", fillMiB, time.Since(start).Round(time.Millisecond))
	// What the guest uses: everything but its free pages (the fill, the
	// kernel, page cache), read just before the save.
	usedKiB := guestUsedKiB(b, e, "src")
	e.ok("template", "save", "src", "golden")
	e.ok("rm", "src", "--force") // the template keeps the instant

	var tplDisk int64
	if m, _ := filepath.Glob(filepath.Join(e.stateDir, "templates", "*", "disk.qcow2")); len(m) == 1 {
		_, tplDisk = fileSizes(b, m[0])
	}
	file := filepath.Join(b.TempDir(), "golden.vmt")
	start = time.Now()
	var ex exportJSON
	e.jsonOK(&ex, "--timeout", "10m", "template", "export", "golden", file)
	exportMS := msSince(start)

	host := newEnv(b)
	start = time.Now()
	host.ok("--timeout", "10m", "template", "import", file, "--as", "golden2")
	importMS := msSince(start)
	start = time.Now()
	host.ok("fork", "golden2", "kid")
	forkMS := msSince(start)
	if got := strings.TrimSpace(host.exec("kid", "sh", "-c", "wc -c </fill/data")); got != strconv.Itoa(fillMiB<<20) {
		b.Errorf("the imported template's child holds %s bytes of the fill, want %d", got, fillMiB<<20)
	}

	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	need := usedKiB<<10 + tplDisk
	b.ReportMetric(mib(ex.Archive), "archive_MiB")
	b.ReportMetric(float64(ex.Archive)/float64(need), "archive/(used+disk)")
	b.ReportMetric(exportMS, "export_ms")
	b.ReportMetric(importMS, "import_ms")
	b.ReportMetric(forkMS, "fork_of_import_ms")
	row := func(k, v string) { fmt.Printf("%-44s %16s\n", k, v) }
	fmt.Printf("\nexport + import, test guest %d MiB with %d MiB non-zero in use\n", memMiB, fillMiB)
	row("RAM file (logical)", fmt.Sprintf("%.1f MiB", mib(ex.Logical)))
	row("stored (zero pages and holes left out)", fmt.Sprintf("%.1f MiB", mib(ex.Stored)))
	row("archive (zstd)", fmt.Sprintf("%.1f MiB", mib(ex.Archive)))
	row("guest's used RAM (MemTotal - MemFree)", fmt.Sprintf("%.1f MiB", mib(usedKiB<<10)))
	row("used RAM + template disk layer", fmt.Sprintf("%.1f MiB", mib(need)))
	row("archive / (used RAM + disk)", fmt.Sprintf("%.2f", float64(ex.Archive)/float64(need)))
	row("export", fmt.Sprintf("%.0f ms", exportMS))
	row("import", fmt.Sprintf("%.0f ms", importMS))
	row("fork of the import to READY", fmt.Sprintf("%.0f ms", forkMS))
	if _, err := os.Stat(file); err != nil {
		b.Fatal(err)
	}
}

// guestUsedKiB is MemTotal - MemFree of machine name's guest, in KiB.
func guestUsedKiB(b *testing.B, e *env, name string) int64 {
	b.Helper()
	var total, free int64
	for _, l := range strings.Split(e.exec(name, "cat", "/proc/meminfo"), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = n
		case "MemFree:":
			free = n
		}
	}
	if total == 0 || free == 0 {
		b.Fatalf("%s: no MemTotal/MemFree in /proc/meminfo", name)
	}
	return total - free
}
