//go:build integration

package tests

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkMCP (make bench-mcp) measures what `vmfork mcp` costs an agent:
// a tool call against the same CLI command (exec and ls: the call's
// round trip over stdio against a vmfork process per command), and an
// agent loop of 20 fork → exec → rm through MCP with the source's pause,
// the host's available memory and the server's RSS per round, which must
// stay flat: a server that kept something of each round would grow.
func BenchmarkMCP(b *testing.B) {
	e := newEnv(b)
	e.stopReapersOnCleanup()
	e.boot("src")
	c := e.mcpStdio("bench", "--source", "src", "--max-machines", "2", "--max-children", "1", "--ttl", "10m")
	var fr mcpFork
	c.call(&fr, "fork", map[string]any{"source": "src", "names": []string{"bench-probe"}})
	const n = 15
	timeIt := func(f func()) float64 {
		var ms []float64
		for range n {
			start := time.Now()
			f()
			ms = append(ms, float64(time.Since(start).Microseconds())/1000)
		}
		slices.Sort(ms)
		return ms[n/2]
	}
	toolExec := timeIt(func() { c.call(nil, "exec", map[string]any{"machine": "bench-probe", "command": []string{"true"}}) })
	cliExec := timeIt(func() { e.ok("exec", "bench-probe", "--json", "--", "true") })
	toolLs := timeIt(func() { c.call(nil, "ls", nil) })
	cliLs := timeIt(func() { e.ok("ls", "--json") })
	b.Logf("median of %d: exec tool %.1f ms, CLI %.1f ms (tool - CLI %+.1f ms); ls tool %.1f ms, CLI %.1f ms (%+.1f ms)",
		n, toolExec, cliExec, toolExec-cliExec, toolLs, cliLs, toolLs-cliLs)
	b.ReportMetric(toolExec-cliExec, "exec-tool-minus-cli-ms")
	b.ReportMetric(toolLs-cliLs, "ls-tool-minus-cli-ms")
	c.call(nil, "rm", map[string]any{"names": []string{"bench-probe"}})

	server := serverPID(b, e.stateDir, "bench")
	var pauses, avail, rss []float64
	const rounds = 20
	for i := range rounds {
		var f mcpFork
		c.call(&f, "fork", map[string]any{"source": "src"})
		k := f.names()[0]
		c.call(nil, "exec", map[string]any{"machine": k, "command": []string{"sh", "-c", "dd if=/dev/urandom of=/tmp/x bs=1M count=8 2>/dev/null"}})
		c.call(nil, "rm", map[string]any{"names": []string{k}})
		pauses = append(pauses, f.PauseMS)
		avail = append(avail, memAvailableMiB(b))
		rss = append(rss, rssMiB(b, server))
		b.Logf("round %2d: %s pause %.1f ms, host MemAvailable %.0f MiB, server RSS %.1f MiB", i+1, k, f.PauseMS, avail[i], rss[i])
	}
	first, last := avail[:5], avail[rounds-5:]
	b.Logf("pause ms: first 5 %v, last 5 %v; MemAvailable mean of the first 5 rounds %.0f MiB, of the last 5 %.0f MiB (%+.0f); server RSS %.1f → %.1f MiB",
		pauses[:5], pauses[rounds-5:], mean(first), mean(last), mean(last)-mean(first), rss[0], rss[rounds-1])
	b.ReportMetric(mean(pauses[rounds-5:])-mean(pauses[:5]), "pause-drift-ms")
	b.ReportMetric(mean(first)-mean(last), "memavail-drop-MiB")
	b.ReportMetric(rss[rounds-1]-rss[0], "server-rss-growth-MiB")
	if got := e.machineNames(); len(got) != 1 {
		b.Errorf("after the loop: want only the source, got %v", got)
	}
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func memAvailableMiB(t testing.TB) float64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	t.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

// serverPID finds the `vmfork mcp --agent agent` of stateDir.
func serverPID(t testing.TB, stateDir, agent string) int {
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + ent.Name() + "/cmdline")
		s := string(cmdline)
		if strings.Contains(s, stateDir) && strings.Contains(s, "\x00mcp\x00") && strings.Contains(s, "--agent\x00"+agent+"\x00") {
			return pid
		}
	}
	t.Fatalf("no vmfork mcp server of agent %s", agent)
	return 0
}

func rssMiB(t testing.TB, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
