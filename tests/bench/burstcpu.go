package bench

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Where a burst's time goes (issue 29): under TCG an idle child still
// costs a few percent of a core (its timer interrupts are emulated), so
// late in a burst the chains of the children still starting compete with
// every child already READY. The sampler reads the host's CPU
// (/proc/stat) and each QEMU's (/proc/PID/stat) about once a second and
// splits the busy time between idle children, children in their start or
// identity chain, the source, vmfork itself (this process: the Manager
// and the harness) and everything else (other processes, the kernel). On
// a KVM host an idle guest halts and costs next to nothing: the idle
// children's share is what such a host would not pay.

// clockTicks is USER_HZ, the unit of /proc/stat and /proc/PID/stat: 100
// on every Linux architecture vmfork runs on (sysconf(_SC_CLK_TCK)).
const clockTicks = 100

// CPUSample is the host's CPU over one interval of a burst, each figure in
// cores (1 = one CPU busy for the whole interval).
type CPUSample struct {
	AtMS float64 `json:"at_ms"` // the interval's end, since the fork call
	// Ready and InChain count the children READY, and started but not
	// READY, at the interval's start: how each child's CPU is counted.
	Ready   int `json:"ready"`
	InChain int `json:"in_chain"`
	CPUSplit
	CPUPressure float64 `json:"cpu_pressure_pct"` // /proc/pressure/cpu some avg10 at the end
}

// CPUSplit is busy CPU by whom: in cores in a sample, in core-seconds
// over a whole burst.
type CPUSplit struct {
	IdleChildren  float64 `json:"idle_children"`  // QEMUs of children already READY
	ChainChildren float64 `json:"chain_children"` // QEMUs of children starting or in their identity chain
	Source        float64 `json:"source"`
	Vmfork        float64 `json:"vmfork"` // this process
	Other         float64 `json:"other"`  // other processes and the kernel
	HostIdle      float64 `json:"host_idle"`
}

func (s CPUSplit) busy() float64 {
	return s.IdleChildren + s.ChainChildren + s.Source + s.Vmfork + s.Other
}

func (s *CPUSplit) add(o CPUSplit, k float64) {
	s.IdleChildren += o.IdleChildren * k
	s.ChainChildren += o.ChainChildren * k
	s.Source += o.Source * k
	s.Vmfork += o.Vmfork * k
	s.Other += o.Other * k
	s.HostIdle += o.HostIdle * k
}

// BurstCPU is where a burst's fork call spent the host's CPU.
type BurstCPU struct {
	CPUs int `json:"cpus"`
	// CoreSeconds sums the samples over the fork call; their total is
	// CPUs × the sampled time.
	CoreSeconds CPUSplit `json:"core_seconds"`
	// ChainCPUSeconds is what each child's QEMU had used when the child
	// became READY: its start and identity chain, the guest's own work.
	ChainCPUSeconds Spread `json:"child_chain_cpu_s"`
	// IdleChildCores is one READY child's CPU at rest (all children up,
	// nothing else of the burst running), in cores: the TCG tax each
	// running child pays while the rest start.
	IdleChildCores float64     `json:"idle_child_cores"`
	Samples        []CPUSample `json:"samples"`
}

// hostTicks returns the busy and total ticks of /proc/stat's cpu line
// (iowait counts as idle: the CPU was free to run something).
func hostTicks(data []byte) (busy, total int64, err error) {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: no cpu line in %q", line)
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: cpu field %d %q: %w", i+1, s, err)
		}
		// guest and guest_nice (fields 9, 10) are already in user and nice.
		if i >= 8 {
			break
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, nil
}

// procTicks returns utime+stime of a /proc/PID/stat (all its threads, the
// exited ones included).
func procTicks(data []byte) (int64, bool) {
	// comm, in parentheses, may hold spaces: fields count from its end.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 { // state is f[0]; utime, stime are fields 14, 15 of the line
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	return u + s, err1 == nil && err2 == nil
}

// guestName returns the machine a QEMU command line names (-name
// guest=NAME), when it runs in state dir dir: every QEMU of the harness's
// own state dir is the burst's.
func guestName(cmdline []byte, dir string) (string, bool) {
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if !strings.Contains(string(cmdline), dir) {
		return "", false
	}
	for i, a := range args[:max(len(args)-1, 0)] {
		if a == "-name" {
			for _, kv := range strings.Split(args[i+1], ",") {
				if n, ok := strings.CutPrefix(kv, "guest="); ok {
					return n, true
				}
			}
		}
	}
	return "", false
}

type cpuSnap struct {
	at          time.Time
	busy, total int64
	self        int64
	procs       map[int]qemuTicks // by pid
}

type qemuTicks struct {
	name  string
	ticks int64
}

// snapCPU reads the host's, this process's and every QEMU of dir's CPU.
func snapCPU(dir string) (cpuSnap, error) {
	s := cpuSnap{at: time.Now(), procs: map[int]qemuTicks{}}
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, err
	}
	if s.busy, s.total, err = hostTicks(data); err != nil {
		return s, err
	}
	if data, err := os.ReadFile("/proc/self/stat"); err == nil {
		s.self, _ = procTicks(data)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return s, err
	}
	for _, en := range ents {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		p := filepath.Join("/proc", en.Name())
		comm, err := os.ReadFile(p + "/comm")
		if err != nil || !bytes.HasPrefix(comm, []byte("qemu-system")) {
			continue
		}
		cmd, err := os.ReadFile(p + "/cmdline")
		if err != nil {
			continue
		}
		name, ok := guestName(cmd, dir)
		if !ok {
			continue
		}
		data, err := os.ReadFile(p + "/stat")
		if err != nil {
			continue
		}
		if t, ok := procTicks(data); ok {
			s.procs[pid] = qemuTicks{name, t}
		}
	}
	return s, nil
}

// cpuSampler samples a burst's CPU until stopped.
type cpuSampler struct {
	dir, source string
	cpus        int
	events      *forkEvents
	t0          time.Time
	pressure    func() (float64, bool)

	mu      sync.Mutex
	samples []CPUSample
}

// split turns the interval from a to b into a sample: each QEMU's CPU
// counted by its child's state at the interval's start (a child that
// became READY inside it counts as in its chain, so the idle children's
// share is never overstated).
func (c *cpuSampler) split(a, b cpuSnap) (CPUSample, bool) {
	dt := b.total - a.total
	if dt <= 0 {
		return CPUSample{}, false
	}
	// Ticks of all CPUs over the interval: cores = ticks × CPUs / dt.
	k := float64(c.cpus) / float64(dt)
	s := CPUSample{AtMS: ms(b.at.Sub(c.t0))}
	var ours int64
	seen := map[string]bool{}
	for pid, q := range b.procs {
		d := q.ticks
		if p, ok := a.procs[pid]; ok && p.name == q.name {
			d -= p.ticks
		} // else the QEMU started within the interval: all its ticks are
		// the interval's.
		ours += d
		v := float64(d) * k
		switch {
		case q.name == c.source:
			s.Source += v
		case c.events.state(q.name, a.at) == stateReady:
			s.IdleChildren += v
		default:
			s.ChainChildren += v
		}
		seen[q.name] = true
	}
	for name := range seen {
		switch c.events.state(name, a.at) {
		case stateReady:
			s.Ready++
		case stateChain:
			s.InChain++
		}
	}
	self := b.self - a.self
	s.Vmfork = float64(self) * k
	s.Other = max(0, float64(b.busy-a.busy-ours-self)*k)
	s.HostIdle = max(0, float64(c.cpus)-s.busy())
	if c.pressure != nil {
		s.CPUPressure, _ = c.pressure()
	}
	return s, true
}

// run samples every period until ctx ends, and once more then.
func (c *cpuSampler) run(ctx context.Context, period time.Duration) {
	prev, err := snapCPU(c.dir)
	if err != nil {
		return
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true // one last, shorter interval: up to the call's end
		case <-t.C:
		}
		now, err := snapCPU(c.dir)
		if err != nil {
			continue
		}
		if s, ok := c.split(prev, now); ok {
			c.mu.Lock()
			c.samples = append(c.samples, s)
			c.mu.Unlock()
		}
		prev = now
	}
}

// result sums the samples into the burst's split.
func (c *cpuSampler) result() BurstCPU {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := BurstCPU{CPUs: c.cpus, Samples: c.samples}
	last := 0.0
	for _, s := range c.samples {
		r.CoreSeconds.add(s.CPUSplit, (s.AtMS-last)/1000)
		last = s.AtMS
	}
	return r
}

// chainCPU returns the CPU seconds pid had used, read when its child
// became READY.
func chainCPU(pid int) (float64, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	t, ok := procTicks(data)
	return float64(t) / clockTicks, ok
}

// idleCost measures the children's CPU at rest over d, in cores per child
// (of n).
func idleCost(ctx context.Context, dir, source string, n int, cpus int, d time.Duration) (float64, error) {
	a, err := snapCPU(dir)
	if err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	b, err := snapCPU(dir)
	if err != nil {
		return 0, err
	}
	var ticks int64
	for pid, q := range b.procs {
		if p, ok := a.procs[pid]; ok && p.name == q.name && q.name != source {
			ticks += q.ticks - p.ticks
		}
	}
	if b.total <= a.total || n == 0 {
		return 0, fmt.Errorf("idle cost: no time passed in /proc/stat")
	}
	return float64(ticks) * float64(cpus) / float64(b.total-a.total) / float64(n), nil
}

// WriteChildrenCSV writes each child's timeline, one row a child, ms
// since the fork call (empty where it never got there).
func (r *BurstResult) WriteChildrenCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cell := func(v float64) string {
		if v == 0 {
			return ""
		}
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	_ = cw.Write([]string{"name", "started_ms", "running_ms", "ready_ms", "failed_ms", "chain_cpu_s"})
	for _, c := range r.Children {
		_ = cw.Write([]string{c.Name, cell(c.StartedMS), cell(c.RunningMS), cell(c.ReadyMS), cell(c.FailedMS),
			strconv.FormatFloat(c.ChainCPUS, 'f', 2, 64)})
	}
	cw.Flush()
	return cw.Error()
}

// WriteCPUCSV writes the CPU samples, one row a second, in cores.
func (r *BurstResult) WriteCPUCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	_ = cw.Write([]string{"at_ms", "ready", "in_chain", "idle_children", "chain_children", "source", "vmfork", "other", "host_idle", "cpu_pressure_pct"})
	if r.CPU != nil {
		for _, s := range r.CPU.Samples {
			_ = cw.Write([]string{strconv.FormatFloat(s.AtMS, 'f', 0, 64), strconv.Itoa(s.Ready), strconv.Itoa(s.InChain),
				f(s.IdleChildren), f(s.ChainChildren), f(s.Source), f(s.Vmfork), f(s.Other), f(s.HostIdle), f(s.CPUPressure)})
		}
	}
	cw.Flush()
	return cw.Error()
}
