//go:build integration

package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// BenchmarkExplore compares `vmfork explore` with three tries against the
// same work done by hand in the same run: fork three children, exec one
// command in each, remove two. explore_over_manual is the ratio of their
// wall times.
//
//	make build && VMFORK_BIN=$PWD/bin/vmfork VMFORK_GUEST=$PWD/tests/guest/out \
//	  go test -tags integration -run '^$' -bench BenchmarkExplore -benchtime 3x ./tests/
func BenchmarkExplore(b *testing.B) {
	e := newEnv(b)
	e.stopReapersOnCleanup()
	e.boot("src")
	tries := []string{"exit 1", "true", "sleep 1"}
	var manual, explore time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		names := []string{"m-" + strconv.Itoa(i) + "-1", "m-" + strconv.Itoa(i) + "-2", "m-" + strconv.Itoa(i) + "-3"}
		e.ok(append([]string{"fork", "src"}, names...)...)
		for j, n := range names {
			e.vmfork("exec", n, "--", "sh", "-c", tries[j])
		}
		e.ok("rm", names[0], names[2])
		manual += time.Since(start)
		e.ok("rm", names[1])

		start = time.Now()
		var res exploreJSON
		e.jsonOK(&res, "explore", "src", "--try", tries[0], "--try", tries[1], "--try", tries[2], "--prefix", "x-"+strconv.Itoa(i))
		explore += time.Since(start)
		if res.Winner == "" {
			b.Fatalf("explore found no winner: %+v", res)
		}
		e.ok("rm", res.Winner)
	}
	b.ReportMetric(float64(manual.Milliseconds())/float64(b.N), "manual_ms/op")
	b.ReportMetric(float64(explore.Milliseconds())/float64(b.N), "explore_ms/op")
	b.ReportMetric(float64(explore)/float64(manual), "explore_over_manual")
}

// BenchmarkTTLReap measures how late the reaper removes a child after its
// deadline (no vmfork command running), next to how long `vmfork rm` takes
// to remove a child in the same run: reap_late_over_rm is their ratio.
//
//	go test -tags integration -run '^$' -bench BenchmarkTTLReap -benchtime 3x ./tests/
func BenchmarkTTLReap(b *testing.B) {
	e := newEnv(b)
	e.stopReapersOnCleanup()
	e.boot("src")
	var late, rm time.Duration
	for i := 0; i < b.N; i++ {
		n := "r-" + strconv.Itoa(i)
		e.ok("fork", "src", n+"-rm")
		start := time.Now()
		e.ok("rm", n+"-rm")
		rm += time.Since(start)

		e.ok("fork", "src", n, "--ttl", "2s")
		var rec struct {
			Expires time.Time `json:"expires"`
		}
		data, err := os.ReadFile(filepath.Join(e.stateDir, "machines", n, "machine.json"))
		if err != nil || json.Unmarshal(data, &rec) != nil || rec.Expires.IsZero() {
			b.Fatalf("record of %s: %v %s", n, err, data)
		}
		dir := filepath.Join(e.stateDir, "machines", n)
		if !waitFor(time.Minute, func() bool { _, err := os.Stat(dir); return os.IsNotExist(err) }) {
			b.Fatalf("%s not reaped within a minute", n)
		}
		late += time.Since(rec.Expires)
	}
	b.ReportMetric(float64(late.Milliseconds())/float64(b.N), "reap_late_ms/op")
	b.ReportMetric(float64(rm.Milliseconds())/float64(b.N), "rm_ms/op")
	b.ReportMetric(float64(late)/float64(rm), "reap_late_over_rm")
}
