//go:build integration

package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/vmfork/vmfork/tests/bench"
)

// BenchmarkContractReady is what a fork contract adds to a child's READY:
// the same one-child fork of one source without a contract and with one
// (egress allow list: host rules made before QEMU starts; inherited
// connections reset; a brokered secret: the broker's registration, the
// placeholders' files and, on Debian, vmfork's CA installed), alternating,
// b.N of each, per guest and network (the busybox guest on QEMU's user
// network and on a bridge, the Debian guest on the user network), with the
// medians of every step.
//
//	go test -tags integration -run '^$' -bench BenchmarkContractReady -benchtime 6x ./tests/
//
// (VMFORK_DEBIAN_GUEST set adds the Debian guest.)
func BenchmarkContractReady(b *testing.B) {
	dir := b.TempDir()
	c := filepath.Join(dir, "contract.yaml")
	os.WriteFile(c, []byte(`network:
  egress: {allow: [10.0.0.0/8:443, "localhost:8080"]}
secrets:
  TOKEN: {hosts: [api.example.com], format: "Bearer {value}", value_from: {exec: 'printf "v-%s" "$VMFORK_NAME"'}}
`), 0o600)
	type run struct {
		ready []float64
		steps map[string][]float64
	}
	measure := func(e *env, src string, with bool, r *run, i int) {
		name := fmt.Sprintf("k%d", i)
		args := []string{src, name}
		if with {
			name = fmt.Sprintf("c%d", i)
			args = []string{src, name, "--contract", c}
		}
		res, _ := e.forkID(0, args...)
		ch := res.Children[0]
		r.ready = append(r.ready, ch.ReadyMS)
		for _, s := range ch.Identity.Steps {
			r.steps[s.Name] = append(r.steps[s.Name], s.DurationMS)
		}
		e.ok("rm", "--force", name)
	}
	report := func(label string, without, with *run) {
		med := bench.Median
		fmt.Printf("\ncontract, %s, %d one-child forks each (medians, ms)\n", label, b.N)
		fmt.Printf("%-28s %10s %10s\n", "", "without", "with")
		fmt.Printf("%-28s %10.1f %10.1f  (x%.2f)\n", "READY", med(without.ready), med(with.ready), med(with.ready)/med(without.ready))
		var names []string
		for n := range with.steps {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Printf("%-28s %10.1f %10.1f\n", n, med(without.steps[n]), med(with.steps[n]))
		}
		b.ReportMetric(med(with.ready)/med(without.ready), label+"-ready-ratio")
	}
	pair := func(e *env, src, label string) {
		without := &run{steps: map[string][]float64{}}
		with := &run{steps: map[string][]float64{}}
		for i := 0; i < b.N; i++ {
			measure(e, src, false, without, i)
			measure(e, src, true, with, i)
		}
		report(label, without, with)
	}
	{
		e := newEnv(b)
		e.boot("src")
		pair(e, "src", "busybox-user")
	}
	{
		// A bridge with a DHCP server of its own: the egress rules are a
		// bridge table on the child's tap, the broker listens on the
		// bridge's host address.
		br := newBridgeNet(b)
		e := newEnv(b)
		br.inNamespace(b, e)
		e.boot("src", "--network", "bridge="+br.bridge)
		pair(e, "src", "busybox-bridge")
	}
	if os.Getenv("VMFORK_DEBIAN_GUEST") == "" {
		return
	}
	// The source is a child of the shared template (tests/doc.go).
	d := newDebianEnv(b)
	d.forkDebian("deb")
	d.settle("deb")
	d.waitIPv4("deb", 2*time.Minute)
	pair(d.env, "deb", "debian-user")
}
