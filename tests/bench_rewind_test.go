//go:build integration

package tests

import (
	"testing"
	"time"
)

// BenchmarkRewind rewinds a running test guest (256 MiB) to its checkpoint
// and, in the same round, forks one child of that checkpoint: both to
// READY (the command returns once the guest agent answers and the identity
// chain has run), timed around the CLI call. It reports the medians and
// their ratio (the target: rewind ≤ 1.25× fork).
//
//	go test -tags integration -run '^$' -bench BenchmarkRewind ./tests/
func BenchmarkRewind(b *testing.B) {
	e := newEnv(b)
	e.boot("src")
	e.exec("src", "vmfork-counter", "start")
	time.Sleep(time.Second)
	e.ok("checkpoint", "src", "--as", "cp1")
	const rounds = 5
	var forks, rewinds []float64
	for range rounds {
		start := time.Now()
		e.ok("fork", "cp1", "kid")
		forks = append(forks, float64(time.Since(start).Microseconds())/1000)
		e.ok("rm", "kid", "--force")
		start = time.Now()
		e.ok("rewind", "src", "--to", "cp1")
		rewinds = append(rewinds, float64(time.Since(start).Microseconds())/1000)
	}
	f, r := median(forks), median(rewinds)
	b.ReportMetric(f, "fork_ready_ms")
	b.ReportMetric(r, "rewind_ready_ms")
	b.ReportMetric(r/f, "rewind/fork")
	b.Logf("fork %v ms, rewind %v ms (medians of %d): rewind/fork %.2f", forks, rewinds, rounds, r/f)
}
