package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/sharedmem"
)

// BurstOptions size a morning burst.
type BurstOptions struct {
	Count     int // children; default 100
	Parallel  int // children started at once; default 4 (vmfork fork's default)
	MemoryMiB int // guest RAM; default 256 (the test guest's size)
	// Busy runs the counter in the source, and so in every child. By
	// default the source is idle, as desktops waiting for their users are.
	Busy bool
}

// Spread is the median, 90th percentile and maximum of a per-child figure.
type Spread struct {
	Median float64 `json:"median"`
	P90    float64 `json:"p90"`
	Max    float64 `json:"max"`
}

func spreadOf(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	return Spread{Median: Median(v), P90: Percentile(v, 90), Max: slices.Max(v)}
}

// BurstResult is `vmfork bench burst`: N children from one source in one
// fork call, as a VDI morning would make them.
type BurstResult struct {
	Host      Host    `json:"host"`
	MemoryMiB int     `json:"memory_mib"`
	Count     int     `json:"count"`
	Parallel  int     `json:"parallel"`
	Busy      bool    `json:"busy"`
	SettleMS  float64 `json:"settle_ms"`
	PauseMS   float64 `json:"source_pause_ms"`
	// WallMS is from the fork call until it returned: every child's agent
	// answered (the call waits for that).
	WallMS            float64 `json:"wall_ms"`
	ChildrenPerSecond float64 `json:"children_per_second"`
	Ready             int     `json:"ready"`
	// Answered counts children whose agent answered a ping sent by the
	// harness after the call returned: an independent check.
	Answered int                 `json:"answered"`
	Failed   []vmfork.ChildError `json:"failed,omitempty"`
	// ReadyAtMS is each child's ready moment since the fork call began,
	// sorted: the cumulative-ready curve.
	ReadyAtMS []float64 `json:"ready_at_ms"`
	RunningMS Spread    `json:"child_running_ms"`
	AgentMS   Spread    `json:"child_agent_ms"` // until the agent answered; ready adds the identity chain
	ReadyMS   Spread    `json:"child_ready_ms"`
	// PSS is read Settle after the call returned, with all children up.
	TotalPSSBytes    int64   `json:"total_pss_bytes"`
	ChildPSSBytes    Spread  `json:"child_pss_bytes"`
	ChildMemory      Memory  `json:"child_memory_median"` // each kind's median
	SourcePSSBytes   int64   `json:"source_pss_bytes"`
	TemplateRAMBytes int64   `json:"template_ram_allocated_bytes"`
	GuestRAMBytes    int64   `json:"children_guest_ram_bytes"` // Count × guest RAM
	PSSShare         float64 `json:"total_pss_share_of_guest_ram"`
	MemAvailBefore   int64   `json:"host_mem_available_before_bytes"`
	MemAvailAfter    int64   `json:"host_mem_available_after_bytes"`
	Ratios           []Ratio `json:"targets"`
	// Children is each child's timeline (started, running, READY), in
	// start order; CPU is where the host's CPU went during the call.
	Children []BurstChild `json:"children"`
	CPU      *BurstCPU    `json:"cpu,omitempty"`
}

// Burst boots a source and forks opt.Count children from it in one call.
func Burst(ctx context.Context, e *Env, opt BurstOptions) (res *BurstResult, err error) {
	if opt.Count <= 0 {
		opt.Count = 100
	}
	if opt.Parallel <= 0 {
		opt.Parallel = 4
	}
	if opt.MemoryMiB <= 0 {
		opt.MemoryMiB = 256
	}
	res = &BurstResult{MemoryMiB: opt.MemoryMiB, Count: opt.Count, Parallel: opt.Parallel, Busy: opt.Busy, SettleMS: ms(e.cfg.Settle)}
	e.begin(opt.Count + 3)
	e.announce("burst: booting the source (%s)", memLabel(opt.MemoryMiB))
	cmdline := idleAppend
	if opt.Busy {
		cmdline = guestAppend
	}
	src, _, err := e.bootWith(ctx, "burst", opt.MemoryMiB, cmdline)
	res.Host = e.host
	if err != nil {
		return res, err
	}
	var fr *vmfork.ForkResult
	defer func() {
		e.announce("burst: removing the children")
		rctx := context.WithoutCancel(ctx)
		if fr != nil {
			for _, c := range fr.Children {
				err = errors.Join(err, e.remove(rctx, c.Name))
			}
		}
		err = errors.Join(err, e.remove(rctx, src.Name))
	}()
	e.step("burst: source booted")
	res.MemAvailBefore = memAvailable()
	e.events.reset(func() { e.step("burst: children answering") })
	defer e.events.reset(nil)
	e.announce("burst: forking %d children, %d at a time", opt.Count, opt.Parallel)
	start := time.Now()
	samp := &cpuSampler{dir: e.dir, source: src.Name, cpus: max(e.host.CPUs, 1), events: e.events, t0: start, pressure: cpuPressure}
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() { defer close(sampled); samp.run(sctx, cpuPeriod) }()
	fr, err = e.mgr.Fork(e.events.attach(ctx), vmfork.ForkRequest{
		Source: src.Name, Count: opt.Count, Parallel: opt.Parallel,
		MaxChildren: max(opt.Count, vmfork.DefaultMaxChildren),
	})
	wall := time.Since(start)
	stopSampling()
	<-sampled
	cpu := samp.result()
	res.CPU, res.Children = &cpu, e.events.timeline(start)
	var chain []float64
	for _, c := range res.Children {
		if c.ChainCPUS > 0 {
			chain = append(chain, c.ChainCPUS)
		}
	}
	cpu.ChainCPUSeconds = spreadOf(chain)
	if fr == nil {
		return res, fmt.Errorf("burst: %w", err)
	}
	if err != nil && !errors.Is(err, vmfork.ErrPartial) {
		return res, fmt.Errorf("burst: %w", err)
	}
	res.WallMS, res.PauseMS, res.Ready, res.Failed = ms(wall), fr.PauseMS, len(fr.Children), fr.Failed
	res.ChildrenPerSecond = float64(res.Ready) / wall.Seconds()
	res.ReadyAtMS = e.events.readySince(start)
	slices.Sort(res.ReadyAtMS)
	res.childTimes(fr.Children)
	e.announce("burst: pinging every child's agent")
	res.Answered = e.pingAll(ctx, fr.Children)
	e.step("burst: %d of %d answer", res.Answered, opt.Count)
	if err := e.settle(ctx); err != nil {
		return res, err
	}
	idle := idleWindow(e.cfg.Settle)
	e.announce("burst: the children's CPU at rest (%s)", idle)
	if c, err := idleCost(ctx, e.dir, src.Name, len(fr.Children), cpu.CPUs, idle); err == nil {
		cpu.IdleChildCores = c
	}
	if err := res.childMemory(fr.Children, opt.MemoryMiB); err != nil {
		return res, err
	}
	if r, err := sharedmem.ReadRollup(src.PID); err == nil {
		res.SourcePSSBytes = r.PSS
	}
	res.TemplateRAMBytes = allocated(e.mgr.Store.TemplatePaths(fr.Template).RAM)
	res.MemAvailAfter = memAvailable()
	res.GuestRAMBytes = int64(opt.Count) * int64(opt.MemoryMiB) << 20
	res.PSSShare = float64(res.TotalPSSBytes) / float64(res.GuestRAMBytes)
	all := res.Answered == opt.Count
	res.Ratios = []Ratio{
		{Name: "children answering their agent", Value: float64(res.Answered), Target: fmt.Sprintf("= %d", opt.Count), Met: &all},
		atMost("total PSS / (N x guest RAM)", res.PSSShare, 0.25),
	}
	e.step("burst: memory read")
	return res, err
}

// cpuPeriod is how often the burst's CPU is sampled.
const cpuPeriod = time.Second

// idleWindow is how long the children's CPU at rest is measured after the
// call and the settle: five settles, 10 s by default (a quick --settle
// makes a quick run).
func idleWindow(settle time.Duration) time.Duration { return max(5*settle, time.Second) }

// cpuPressure returns /proc/pressure/cpu's "some avg10".
func cpuPressure() (float64, bool) {
	data, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "avg10="); ok {
			p, err := strconv.ParseFloat(v, 64)
			return p, err == nil
		}
	}
	return 0, false
}

// childTimes fills the spreads of the children's running, agent and ready
// times.
func (res *BurstResult) childTimes(cs []vmfork.ChildResult) {
	var run, agent, ready []float64
	for _, c := range cs {
		run, ready = append(run, c.RunningMS), append(ready, c.ReadyMS)
		for _, st := range identitySteps(c.Identity) {
			if st.Name == agentStep {
				agent = append(agent, c.RunningMS+st.DurationMS)
			}
		}
	}
	res.RunningMS, res.AgentMS, res.ReadyMS = spreadOf(run), spreadOf(agent), spreadOf(ready)
}

// childMemory reads each child's memory (guests of memMiB) into the
// total, the spread and each kind's median.
func (res *BurstResult) childMemory(cs []vmfork.ChildResult, memMiB int) error {
	var pss []float64
	var kinds [4][]float64
	for _, c := range cs {
		m, err := readMemory(c.PID, "", int64(memMiB)<<20)
		if err != nil {
			return err
		}
		res.TotalPSSBytes += m.Total()
		pss = append(pss, float64(m.Total()))
		for i, v := range []int64{m.GuestRAMBytes, m.TCGBytes, m.AnonBytes, m.FileBytes} {
			kinds[i] = append(kinds[i], float64(v))
		}
	}
	res.ChildPSSBytes = spreadOf(pss)
	res.ChildMemory = Memory{GuestRAMBytes: int64(Median(kinds[0])), TCGBytes: int64(Median(kinds[1])),
		AnonBytes: int64(Median(kinds[2])), FileBytes: int64(Median(kinds[3]))}
	return nil
}

// pingAll counts the children whose guest agent answers a ping now.
func (e *Env) pingAll(ctx context.Context, cs []vmfork.ChildResult) int {
	n := 0
	for _, c := range cs {
		m, err := e.mgr.Store.LoadMachine(c.Name)
		if err != nil {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		a, err := e.mgr.Driver.Agent(actx, m)
		if err == nil {
			if a.Ping(actx) == nil {
				n++
			}
			a.Close()
		}
		cancel()
	}
	return n
}

// allocated returns the bytes a (sparse) file occupies.
func allocated(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
