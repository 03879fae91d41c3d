//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qemudrv"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/sharedmem"
	"github.com/vmfork/vmfork/tests/bench"
)

// forkBenchRow is one round: a fork of one child, and the floor measured
// right next to it.
type forkBenchRow struct {
	PauseMS     float64 `json:"pause_ms"`
	RunningMS   float64 `json:"child_running_ms"`
	ReadyMS     float64 `json:"child_ready_ms"`
	FloorMS     float64 `json:"floor_ms"`
	DiskAtBirth int64   `json:"child_disk_at_birth_bytes"`
	// IdentityMS is the identity chain's time per step, by step name.
	IdentityMS map[string]float64 `json:"identity_step_ms"`
}

// BenchmarkFork forks a running test guest (256 MiB) one child per round and,
// in the same round, measures the floor: a bare qemu-system-x86_64 -incoming
// defer of the same configuration loading the same device state, with no
// vmfork around it. It reports medians and ratios, and per-child memory
// (PSS) against the source's resident memory once all children ran a while.
//
//	make bench    (go test -tags integration -run '^$' -bench BenchmarkFork ./tests/)
//
// VMFORK_BENCH_JSON=FILE also writes the figures as JSON.
func BenchmarkFork(b *testing.B) {
	e := newEnv(b)
	src := e.boot("src")
	e.exec("src", "vmfork-counter", "start")
	time.Sleep(2 * time.Second)

	fork := func(name string) (row forkBenchRow, pid int) {
		var res forkIDJSON
		e.jsonOK(&res, "fork", "src", name)
		c := res.Children[0]
		row.PauseMS, row.RunningMS, row.ReadyMS = res.PauseMS, c.RunningMS, c.ReadyMS
		row.IdentityMS = map[string]float64{}
		for _, s := range c.Identity.Steps {
			row.IdentityMS[s.Name] = s.DurationMS
		}
		row.DiskAtBirth = diskAtBirth(b, e.stateDir, name)
		return row, c.PID
	}
	rows, children := forkRounds(b, func(i int) string { return "c" + strconv.Itoa(i) }, fork,
		func(child string, _ int) float64 { return floor(b, e, child) })
	srcRSS, pss := childMemory(b, src.PID, children)

	md := mediansOf(rows)
	pause, running, ready, floorMS, disk := md.PauseMS, md.RunningMS, md.ReadyMS, md.FloorMS, md.DiskKiB
	childPSS := bench.Median(pss)

	b.ReportMetric(pause, "pause-ms")
	b.ReportMetric(running, "child-running-ms")
	b.ReportMetric(ready, "child-ready-ms")
	b.ReportMetric(floorMS, "floor-ms")
	b.ReportMetric(running/floorMS, "running/floor")
	b.ReportMetric(childPSS, "child-pss-MiB")
	b.ReportMetric(srcRSS, "source-rss-MiB")
	b.ReportMetric(disk, "child-disk-KiB")

	row := func(k, v string) { fmt.Printf("%-34s %10s\n", k, v) }
	fmt.Printf("\nvmfork fork, test guest 256 MiB, %d rounds (medians), accel %s\n", len(rows), accelOf(e))
	row("source pause", fmt.Sprintf("%.1f ms", pause))
	row("child running (vmfork)", fmt.Sprintf("%.1f ms", running))
	row("floor (bare QEMU -incoming defer)", fmt.Sprintf("%.1f ms", floorMS))
	row("child running / floor", fmt.Sprintf("%.2fx", running/floorMS))
	row("child ready (agent answers)", fmt.Sprintf("%.1f ms", ready))
	row("child PSS", fmt.Sprintf("%.1f MiB", childPSS))
	row("source RSS", fmt.Sprintf("%.1f MiB", srcRSS))
	row("child PSS / source RSS", fmt.Sprintf("%.2f", childPSS/srcRSS))
	row("child disk at birth", fmt.Sprintf("%.0f KiB", disk))
	fmt.Printf("identity chain, per step:\n")
	for _, st := range rows[0].Identity() {
		v := medianOf(rows, func(r forkBenchRow) float64 { return r.IdentityMS[st] })
		b.ReportMetric(v, "id-"+strings.TrimPrefix(st, "vmfork.")+"-ms")
		row("  "+st, fmt.Sprintf("%.1f ms", v))
	}

	writeBenchJSON(b, map[string]any{
		"guest_memory_mib": 256, "accel": accelOf(e), "rounds": rows, "child_pss_mib": pss,
		"source_rss_mib": srcRSS, "median_pause_ms": pause, "median_child_running_ms": running,
		"median_child_ready_ms": ready, "median_floor_ms": floorMS,
	})
}

// forkRounds runs the b.N rounds of a fork benchmark. Round i forks child
// name(i) and measures the floor next to it: after the fork in even rounds,
// before it (for the previous child) in odd ones, so that neither always
// meets a warmer cache. It returns the rows and the children's pids.
func forkRounds(b *testing.B, name func(round int) string, fork func(name string) (forkBenchRow, int),
	floor func(child string, round int) float64) (rows []forkBenchRow, pids []int) {
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var row forkBenchRow
		var pid int
		if i%2 == 0 {
			row, pid = fork(name(i))
			row.FloorMS = floor(name(i), i)
		} else {
			floorMS := floor(name(i-1), i)
			row, pid = fork(name(i))
			row.FloorMS = floorMS
		}
		rows, pids = append(rows, row), append(pids, pid)
	}
	b.StopTimer()
	return rows, pids
}

// diskAtBirth is what child name's disk overlay holds right after its fork.
func diskAtBirth(b *testing.B, stateDir, name string) int64 {
	b.Helper()
	n, err := overlay.AllocatedBytes(filepath.Join(stateDir, "machines", name, "disk.qcow2"))
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// childMemory lets the children run and touch memory for a while, then
// returns the source's RSS and each child's PSS, in MiB.
func childMemory(b *testing.B, srcPID int, children []int) (srcRSS float64, pss []float64) {
	b.Helper()
	time.Sleep(3 * time.Second)
	src, err := sharedmem.ReadRollup(srcPID)
	if err != nil {
		b.Fatal(err)
	}
	for _, pid := range children {
		r, err := sharedmem.ReadRollup(pid)
		if err != nil {
			b.Fatal(err)
		}
		pss = append(pss, float64(r.PSS)/(1<<20))
	}
	return float64(src.RSS) / (1 << 20), pss
}

// forkMedians are the medians of a fork benchmark's rows.
type forkMedians struct {
	PauseMS, RunningMS, ReadyMS, FloorMS, DiskKiB float64
}

func mediansOf(rows []forkBenchRow) forkMedians {
	return forkMedians{
		PauseMS:   medianOf(rows, func(r forkBenchRow) float64 { return r.PauseMS }),
		RunningMS: medianOf(rows, func(r forkBenchRow) float64 { return r.RunningMS }),
		ReadyMS:   medianOf(rows, func(r forkBenchRow) float64 { return r.ReadyMS }),
		FloorMS:   medianOf(rows, func(r forkBenchRow) float64 { return r.FloorMS }),
		DiskKiB:   medianOf(rows, func(r forkBenchRow) float64 { return float64(r.DiskAtBirth) / 1024 }),
	}
}

// medianOf is the median of one column of rows.
func medianOf(rows []forkBenchRow, col func(forkBenchRow) float64) float64 {
	var v []float64
	for _, r := range rows {
		v = append(v, col(r))
	}
	return bench.Median(v)
}

// writeBenchJSON writes a benchmark's figures to VMFORK_BENCH_JSON, if set.
func writeBenchJSON(b *testing.B, figures map[string]any) {
	out := os.Getenv("VMFORK_BENCH_JSON")
	if out == "" {
		return
	}
	data, _ := json.MarshalIndent(figures, "", "  ")
	if err := os.WriteFile(out, data, 0o644); err != nil {
		b.Fatal(err)
	}
}

// Identity returns the identity steps of a row in chain order.
func (r forkBenchRow) Identity() []string {
	var names []string
	for n := range r.IdentityMS {
		names = append(names, n)
	}
	order := []string{"vmfork.agent", "vmfork.clock", "vmfork.rng", "vmfork.hostname", "vmfork.machine-id", "vmfork.ssh-host-keys", "vmfork.network", "vmfork.hooks"}
	slices.SortFunc(names, func(a, b string) int { return slices.Index(order, a) - slices.Index(order, b) })
	return names
}

func accelOf(e *env) string {
	for _, m := range e.list() {
		var rec vmfork.Machine
		data, err := os.ReadFile(filepath.Join(e.stateDir, "machines", m.Name, "machine.json"))
		if err == nil && json.Unmarshal(data, &rec) == nil {
			return rec.Accel
		}
	}
	return "?"
}

// floor starts a bare QEMU from the template of child name, the way the
// reference sequence does it, and returns the time from spawn to running.
// The overlay is made before the clock starts; the QEMU is killed after.
func floor(b *testing.B, e *env, name string) float64 {
	b.Helper()
	var child vmfork.Machine
	data, err := os.ReadFile(filepath.Join(e.stateDir, "machines", name, "machine.json"))
	if err != nil || json.Unmarshal(data, &child) != nil {
		b.Fatalf("read %s's record: %v", name, err)
	}
	dir := b.TempDir()
	m := child
	m.Name = "floor"
	m.Paths = vmfork.Paths{
		Dir: dir, Disk: filepath.Join(dir, "disk.qcow2"), QMP: filepath.Join(dir, "qmp.sock"),
		QGA: filepath.Join(dir, "qga.sock"), Serial: filepath.Join(dir, "serial.log"),
		Log: filepath.Join(dir, "qemu.log"), RAM: child.Paths.RAM,
	}
	m.Spec.Ports = nil
	tplDir := filepath.Join(e.stateDir, "templates", child.Template)
	ctx := b.Context()
	if err := overlay.Create(ctx, filepath.Join(tplDir, "disk.qcow2"), m.Paths.Disk); err != nil {
		b.Fatal(err)
	}
	args := qemudrv.Argv(&m, qemudrv.ArgvOptions{Incoming: true})
	start := time.Now()
	cmd := exec.Command("qemu-system-x86_64", args...)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}()
	var mon *qmp.Monitor
	for {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		mon, err = qmp.Dial(dctx, m.Paths.QMP)
		cancel()
		if err == nil {
			break
		}
		if time.Since(start) > 30*time.Second {
			b.Fatalf("floor QEMU: no QMP: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	defer mon.Close()
	if err := qemustate.SetIgnoreShared(ctx, mon); err != nil {
		b.Fatal(err)
	}
	if err := qemustate.LoadDeviceState(ctx, mon, "st", filepath.Join(tplDir, "devstate"), time.Millisecond, nil); err != nil {
		b.Fatal(err)
	}
	if err := mon.Cont(ctx); err != nil {
		b.Fatal(err)
	}
	return float64(time.Since(start).Microseconds()) / 1000
}
