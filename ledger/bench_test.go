package ledger

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// benchClaims measures claims of fresh keys (each one a write and an
// fdatasync, shared by claims that arrive together) through the whole
// path: a guest's stream on a unix socket (QEMU's chardev), the server's
// session, the store. It reports claims/s and the latency of one claim,
// median and 99th percentile.
func benchClaims(b *testing.B, machines int) {
	dir := b.TempDir()
	ts := startServer(b, ServerOptions{Dir: filepath.Join(dir, "ledger"), Rate: fast, Limits: Limits{Records: 1 << 30, LogBytes: 1 << 40}})
	guests := make([]*guest, machines)
	for i := range guests {
		q := newFakeQEMU(b, filepath.Join(dir, fmt.Sprintf("m%d.sock", i)))
		if err := ts.client.Attach(b.Context(), Machine{Name: fmt.Sprintf("m%d", i), Family: "fam", Socket: q.path}); err != nil {
			b.Fatal(err)
		}
		g, err := q.next()
		if err != nil {
			b.Fatal(err)
		}
		guests[i] = g
	}
	lat := make([][]time.Duration, machines)
	errs := make(chan error, machines)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, g := range guests {
		n := b.N / machines
		if i < b.N%machines {
			n++
		}
		wg.Go(func() {
			for j := range n {
				t0 := time.Now()
				ans, err := g.ask(fmt.Sprintf("claim %d-%d-%d", b.N, i, j))
				if err != nil || ans != "granted" {
					errs <- fmt.Errorf("got %q, %v", ans, err)
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "claims/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
}

func BenchmarkClaim1Machine(b *testing.B)   { benchClaims(b, 1) }
func BenchmarkClaim16Machines(b *testing.B) { benchClaims(b, 16) }

// BenchmarkClaimTaken is 16 machines racing for the same keys: one write
// per key, fifteen answers that wait only for it to be synced.
func BenchmarkClaimTaken(b *testing.B) {
	st, err := OpenStore(b.TempDir(), StoreOptions{Limits: Limits{Records: 1 << 30, LogBytes: 1 << 40}})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	b.ResetTimer()
	start := time.Now()
	for k := range b.N / 16 {
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() { st.Claim("fam", fmt.Sprintf("m%d", i), fmt.Sprintf("k%d", k)) })
		}
		wg.Wait()
	}
	b.ReportMetric(float64(b.N/16*16)/time.Since(start).Seconds(), "answers/s")
}

// BenchmarkHelperClaim is one `vmfork-ledger claim` under dash against a
// fake port (helper_test.go): what a shell script pays per call, mostly
// the processes the helper starts.
func BenchmarkHelperClaim(b *testing.B) {
	if _, err := exec.LookPath("dash"); err != nil {
		b.Skip(err)
	}
	st, err := OpenStore(b.TempDir(), StoreOptions{Limits: Limits{Records: 1 << 30, LogBytes: 1 << 40}})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	p := newFakePort(b)
	p.serve(b, st, "fam", "m")
	script := filepath.Join(b.TempDir(), HelperName)
	if err := os.WriteFile(script, Helper, 0o755); err != nil {
		b.Fatal(err)
	}
	env := append(os.Environ(), "VMFORK_LEDGER_PORT="+p.path, "VMFORK_LEDGER_LOCK="+filepath.Join(b.TempDir(), "lock"))
	b.ResetTimer()
	for i := range b.N {
		cmd := exec.Command("dash", script, "claim", fmt.Sprintf("k%d", i))
		cmd.Env = env
		if out, err := cmd.Output(); err != nil || string(out) != "granted\n" {
			b.Fatalf("got %q, %v", out, err)
		}
	}
}
