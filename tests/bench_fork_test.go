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
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/sharedmem"
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

	var rows []forkBenchRow
	var children []int
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := "c" + strconv.Itoa(i)
		var row forkBenchRow
		fork := func() {
			var res forkIDJSON
			e.jsonOK(&res, "fork", "src", name)
			c := res.Children[0]
			row.PauseMS, row.RunningMS, row.ReadyMS = res.PauseMS, c.RunningMS, c.ReadyMS
			row.IdentityMS = map[string]float64{}
			for _, s := range c.Identity.Steps {
				row.IdentityMS[s.Name] = s.DurationMS
			}
			children = append(children, c.PID)
			n, err := overlay.AllocatedBytes(filepath.Join(e.stateDir, "machines", name, "disk.qcow2"))
			if err != nil {
				b.Fatal(err)
			}
			row.DiskAtBirth = n
		}
		// Alternate which goes first, so neither always meets a warmer cache.
		if i%2 == 0 {
			fork()
			row.FloorMS = floor(b, e, name)
		} else {
			row.FloorMS = floor(b, e, "c"+strconv.Itoa(i-1))
			fork()
		}
		rows = append(rows, row)
	}
	b.StopTimer()

	time.Sleep(3 * time.Second) // let children run and touch memory
	srcMem, err := sharedmem.ReadRollup(src.PID)
	if err != nil {
		b.Fatal(err)
	}
	var pss []float64
	for _, pid := range children {
		r, err := sharedmem.ReadRollup(pid)
		if err != nil {
			b.Fatal(err)
		}
		pss = append(pss, float64(r.PSS)/(1<<20))
	}

	col := func(f func(forkBenchRow) float64) float64 {
		var v []float64
		for _, r := range rows {
			v = append(v, f(r))
		}
		return median(v)
	}
	pause := col(func(r forkBenchRow) float64 { return r.PauseMS })
	running := col(func(r forkBenchRow) float64 { return r.RunningMS })
	ready := col(func(r forkBenchRow) float64 { return r.ReadyMS })
	floorMS := col(func(r forkBenchRow) float64 { return r.FloorMS })
	disk := col(func(r forkBenchRow) float64 { return float64(r.DiskAtBirth) / 1024 })
	childPSS := median(pss)
	srcRSS := float64(srcMem.RSS) / (1 << 20)

	b.ReportMetric(pause, "pause-ms")
	b.ReportMetric(running, "child-running-ms")
	b.ReportMetric(ready, "child-ready-ms")
	b.ReportMetric(floorMS, "floor-ms")
	b.ReportMetric(running/floorMS, "running/floor")
	b.ReportMetric(childPSS, "child-pss-MiB")
	b.ReportMetric(srcRSS, "source-rss-MiB")
	b.ReportMetric(disk, "child-disk-KiB")

	fmt.Printf("\nvmfork fork, test guest 256 MiB, %d rounds (medians), accel %s\n", len(rows), accelOf(e))
	fmt.Printf("%-34s %10s\n", "source pause", fmt.Sprintf("%.1f ms", pause))
	fmt.Printf("%-34s %10s\n", "child running (vmfork)", fmt.Sprintf("%.1f ms", running))
	fmt.Printf("%-34s %10s\n", "floor (bare QEMU -incoming defer)", fmt.Sprintf("%.1f ms", floorMS))
	fmt.Printf("%-34s %10s\n", "child running / floor", fmt.Sprintf("%.2fx", running/floorMS))
	fmt.Printf("%-34s %10s\n", "child ready (agent answers)", fmt.Sprintf("%.1f ms", ready))
	fmt.Printf("%-34s %10s\n", "child PSS", fmt.Sprintf("%.1f MiB", childPSS))
	fmt.Printf("%-34s %10s\n", "source RSS", fmt.Sprintf("%.1f MiB", srcRSS))
	fmt.Printf("%-34s %10s\n", "child PSS / source RSS", fmt.Sprintf("%.2f", childPSS/srcRSS))
	fmt.Printf("%-34s %10s\n", "child disk at birth", fmt.Sprintf("%.0f KiB", disk))
	fmt.Printf("identity chain, per step:\n")
	for _, st := range rows[0].Identity() {
		v := col(func(r forkBenchRow) float64 { return r.IdentityMS[st] })
		b.ReportMetric(v, "id-"+strings.TrimPrefix(st, "vmfork.")+"-ms")
		fmt.Printf("%-34s %10s\n", "  "+st, fmt.Sprintf("%.1f ms", v))
	}

	if out := os.Getenv("VMFORK_BENCH_JSON"); out != "" {
		data, _ := json.MarshalIndent(map[string]any{
			"guest_memory_mib": 256, "accel": accelOf(e), "rounds": rows, "child_pss_mib": pss,
			"source_rss_mib": srcRSS, "median_pause_ms": pause, "median_child_running_ms": running,
			"median_child_ready_ms": ready, "median_floor_ms": floorMS,
		}, "", "  ")
		if err := os.WriteFile(out, data, 0o644); err != nil {
			b.Fatal(err)
		}
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

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
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
	if err := mon.MigrateSetCapabilities(ctx, []qmp.Capability{{Name: qmp.CapXIgnoreShared, State: true}}); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(filepath.Join(tplDir, "devstate"))
	if err != nil {
		b.Fatal(err)
	}
	err = mon.GetFD(ctx, "st", f)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	if err := mon.MigrateIncoming(ctx, "fd:st"); err != nil {
		b.Fatal(err)
	}
	if _, err := mon.WaitMigration(ctx, time.Millisecond); err != nil {
		b.Fatal(err)
	}
	if err := mon.Cont(ctx); err != nil {
		b.Fatal(err)
	}
	return float64(time.Since(start).Microseconds()) / 1000
}
