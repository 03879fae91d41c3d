package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/sharedmem"
)

// Method is one way of making a running copy of a guest.
type Method string

// The comparators of `vmfork bench peers`, in the order of a round's
// rotation. vmfork comes first so that the first round makes the template
// the floor and the warm pool load.
const (
	MethodVmfork  Method = "vmfork"
	MethodFloor   Method = "floor"
	MethodWarm    Method = "warm_pool"
	MethodRestore Method = "libvirt_restore"
	MethodCold    Method = "cold_boot"
)

// Label is the method's name in tables and plots.
func (m Method) Label() string {
	switch m {
	case MethodVmfork:
		return "vmfork fork (live source)"
	case MethodFloor:
		return "floor: bare QEMU -incoming"
	case MethodWarm:
		return "warm pool (prototype)"
	case MethodRestore:
		return "libvirt save + restore"
	case MethodCold:
		return "cold boot"
	}
	return string(m)
}

// Phases split a child's time, where the method lets the harness see them.
type Phases struct {
	QEMUStartMS float64 `json:"qemu_start_ms,omitempty"` // spawn until QMP answers
	LoadMS      float64 `json:"load_ms,omitempty"`       // x-ignore-shared and device state in, until completed
	ContMS      float64 `json:"cont_ms,omitempty"`
	AgentMS     float64 `json:"agent_ms,omitempty"`    // running until the guest agent answers
	IdentityMS  float64 `json:"identity_ms,omitempty"` // vmfork: the identity chain after the agent answered
	SaveMS      float64 `json:"save_ms,omitempty"`
	CopyMS      float64 `json:"copy_ms,omitempty"`
	RestoreMS   float64 `json:"restore_ms,omitempty"`
}

// Step is one identity-chain step of a vmfork child, as ForkResult reports it.
type Step struct {
	Name       string  `json:"name"`
	Status     string  `json:"status"`
	DurationMS float64 `json:"duration_ms"`
}

// agentStep is the identity chain's first step: it waits for the agent.
const agentStep = "vmfork.agent"

// identitySteps reads the steps from a child's identity result through its
// JSON form, which is vmfork's output contract (its Go types are not).
func identitySteps(id any) []Step {
	data, err := json.Marshal(id)
	if err != nil {
		return nil
	}
	var r struct {
		Steps []Step `json:"steps"`
	}
	if json.Unmarshal(data, &r) != nil {
		return nil
	}
	return r.Steps
}

// Sample is one child made one way. Zero means "does not apply".
type Sample struct {
	Method Method `json:"method"`
	Round  int    `json:"round"`
	// RunningMS is until the child's vCPUs run, ReadyMS until its guest
	// agent answers, both from the start of the child's own work (for
	// vmfork after the source's pause, as ForkResult reports it).
	RunningMS float64 `json:"running_ms,omitempty"`
	ReadyMS   float64 `json:"ready_ms"`
	// AgentMS is until the guest agent first answers. It is ReadyMS except
	// for vmfork, whose children are ready only after the identity chain
	// gave them their own identity (a libvirt clone gets none).
	AgentMS  float64 `json:"agent_ms"`
	PSSBytes int64   `json:"pss_bytes"`
	Memory   Memory  `json:"memory"`
	// PoolIdlePSSBytes is what a warm-pool QEMU holds while it waits.
	PoolIdlePSSBytes int64 `json:"pool_idle_pss_bytes,omitempty"`
	// PauseMS is how long the source did not run: vmfork's freeze, or
	// libvirt's save plus the restore that brings the source back.
	PauseMS float64 `json:"source_pause_ms,omitempty"`
	// WallMS is the whole clone operation, source's part included.
	WallMS        float64 `json:"wall_ms,omitempty"`
	SaveFileBytes int64   `json:"save_file_bytes,omitempty"`
	Phases        Phases  `json:"phases"`
	Steps         []Step  `json:"identity_steps,omitempty"`
}

// Summary is the medians of one method's samples.
type Summary struct {
	Method    Method  `json:"method"`
	Label     string  `json:"label"`
	Samples   int     `json:"samples"`
	RunningMS float64 `json:"running_ms,omitempty"`
	ReadyMS   float64 `json:"ready_ms"`
	AgentMS   float64 `json:"agent_ms"`
	PSSBytes  int64   `json:"pss_bytes"`
	Memory    Memory  `json:"memory"`
	PoolIdle  int64   `json:"pool_idle_pss_bytes,omitempty"`
	PauseMS   float64 `json:"source_pause_ms,omitempty"`
	WallMS    float64 `json:"wall_ms,omitempty"`
	Phases    Phases  `json:"phases"`
	Steps     []Step  `json:"identity_steps,omitempty"`
}

// Ratio compares vmfork with a reference. Met is nil where there is no target.
type Ratio struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Target string  `json:"target,omitempty"`
	Met    *bool   `json:"met,omitempty"`
	// By is how far the value is from the target, as a factor (> 1 when
	// missed).
	By float64 `json:"missed_by,omitempty"`
}

// PeersSize is the comparison at one guest RAM size.
type PeersSize struct {
	MemoryMiB      int       `json:"memory_mib"`
	SourceBootMS   float64   `json:"source_boot_ms"`
	LibvirtBootMS  float64   `json:"libvirt_boot_ms,omitempty"`
	SourceRSSBytes int64     `json:"source_rss_bytes"`
	Summary        []Summary `json:"summary"`
	Ratios         []Ratio   `json:"ratios"`
	Samples        []Sample  `json:"samples"`
}

// PeersResult is `vmfork bench peers`.
type PeersResult struct {
	Host     Host        `json:"host"`
	Rounds   int         `json:"rounds"`
	SettleMS float64     `json:"settle_ms"`
	Sizes    []PeersSize `json:"sizes"`
}

// PeersOptions choose the sizes and the number of rounds.
type PeersOptions struct {
	MemoryMiB []int // default 512 and 2048
	Rounds    int   // default 5
}

// Peers makes one child each way per round, for each guest RAM size, and
// alternates the order of the ways between rounds so that none always runs
// on a warmer (or busier) host. A partial result comes back with an error.
func Peers(ctx context.Context, e *Env, opt PeersOptions) (*PeersResult, error) {
	if len(opt.MemoryMiB) == 0 {
		opt.MemoryMiB = []int{512, 2048}
	}
	if opt.Rounds <= 0 {
		opt.Rounds = 5
	}
	methods := []Method{MethodVmfork, MethodFloor, MethodWarm, MethodRestore, MethodCold}
	if e.cfg.LibvirtURI == "" {
		methods = []Method{MethodVmfork, MethodFloor, MethodWarm, MethodCold}
	}
	res := &PeersResult{Rounds: opt.Rounds, SettleMS: ms(e.cfg.Settle)}
	e.begin(len(opt.MemoryMiB) * (2 + opt.Rounds*len(methods)))
	for _, mem := range opt.MemoryMiB {
		sz, err := e.peersAt(ctx, mem, opt.Rounds, methods)
		res.Host = e.host
		if sz != nil {
			res.Sizes = append(res.Sizes, *sz)
		}
		if err != nil {
			return res, fmt.Errorf("peers at %d MiB: %w", mem, err)
		}
	}
	return res, nil
}

func (e *Env) peersAt(ctx context.Context, mem, rounds int, methods []Method) (sz *PeersSize, err error) {
	sz = &PeersSize{MemoryMiB: mem}
	src := fmt.Sprintf("src%d", mem)
	e.announce("peers %s: booting the source", memLabel(mem))
	m, bootD, err := e.boot(ctx, src, mem)
	if err != nil {
		return nil, err
	}
	sz.SourceBootMS = ms(bootD)
	var children []string
	defer func() {
		// Children first: a template goes with its last child.
		rctx := context.WithoutCancel(ctx)
		err = errors.Join(err, e.remove(rctx, children...), e.remove(rctx, src))
	}()
	e.step("peers %s: source booted", memLabel(mem))
	var dom *libvirtDomain
	if e.cfg.LibvirtURI != "" {
		e.announce("peers %s: booting the libvirt domain", memLabel(mem))
		var d time.Duration
		if dom, d, err = e.createDomain(ctx, mem, m.Spec.MachineType); err != nil {
			return sz, fmt.Errorf("libvirt domain: %w", err)
		}
		sz.LibvirtBootMS = ms(d)
		defer func() { err = errors.Join(err, e.destroyDomain(context.WithoutCancel(ctx), dom.name)) }()
	}
	e.step("peers %s: libvirt domain booted", memLabel(mem))
	for r := range rounds {
		for i := range methods {
			meth := methods[(i+r)%len(methods)]
			e.announce("peers %s round %d/%d: %s", memLabel(mem), r+1, rounds, meth.Label())
			var s Sample
			last := ""
			if len(children) > 0 {
				last = children[len(children)-1]
			}
			switch meth {
			case MethodVmfork:
				var child string
				s, child, err = e.forkOne(ctx, src)
				if child != "" {
					children = append(children, child)
				}
				// One child at a time, but the previous one only goes now: the
				// floor and the warm pool of this round may have used its template.
				if err == nil && len(children) > 1 {
					err = e.remove(ctx, children[0])
					children = children[1:]
				}
			case MethodFloor:
				s, err = e.floor(ctx, last)
			case MethodWarm:
				s, err = e.warm(ctx, last)
			case MethodRestore:
				s, err = e.saveRestore(ctx, dom)
			case MethodCold:
				s, err = e.coldBoot(ctx, fmt.Sprintf("cold%d-%d", mem, r+1), mem)
			}
			if err != nil {
				return sz, fmt.Errorf("round %d: %s: %w", r+1, meth.Label(), err)
			}
			s.Method, s.Round = meth, r+1
			sz.Samples = append(sz.Samples, s)
			e.step("peers %s round %d/%d: %s ready in %.0f ms", memLabel(mem), r+1, rounds, meth.Label(), s.ReadyMS)
		}
	}
	if r, err := sharedmem.ReadRollup(m.PID); err == nil {
		sz.SourceRSSBytes = r.RSS
	}
	sz.Summary = summarize(sz.Samples, methods)
	sz.Ratios = peerRatios(sz.Summary)
	return sz, nil
}

// forkOne forks one child of src and reads its memory once it settled.
func (e *Env) forkOne(ctx context.Context, src string) (Sample, string, error) {
	e.events.reset(nil)
	start := time.Now()
	res, err := e.mgr.Fork(ctx, vmfork.ForkRequest{Source: src, Count: 1})
	wall := time.Since(start)
	if res == nil || len(res.Children) == 0 {
		if err == nil {
			err = errors.New("fork returned no child")
		}
		return Sample{}, "", err
	}
	c := res.Children[0]
	if err != nil {
		return Sample{}, c.Name, err
	}
	s := Sample{RunningMS: c.RunningMS, ReadyMS: c.ReadyMS, PauseMS: res.PauseMS, WallMS: ms(wall)}
	s.Steps = identitySteps(c.Identity)
	s.Phases = e.forkPhases(c, s.Steps)
	s.AgentMS = c.RunningMS + s.Phases.AgentMS
	ram := e.mgr.Store.TemplatePaths(res.Template).RAM
	mem, err := e.mgr.Store.LoadMachine(src)
	if err != nil {
		return s, c.Name, err
	}
	size := int64(mem.Spec.MemoryMiB) << 20
	s, err = e.finishSample(ctx, s, func() (Memory, error) { return readMemory(c.PID, ram, size) })
	return s, c.Name, err
}

// forkPhases splits a fork child's time at the moments vmfork logged (see
// eventHook): the end of the freeze (the child's start), its QEMU's first
// command after qmp_capabilities (QMP is up), set_link (sent right after the
// load completed), and vmfork's own running and ready figures. QEMU START then includes the
// overlay and the records, which the floor does not have. Zero phases when
// an event is missing (vmfork's logging changed).
func (e *Env) forkPhases(c vmfork.ChildResult, steps []Step) Phases {
	// After running: the agent step, then the rest of the chain.
	p := Phases{AgentMS: c.ReadyMS - c.RunningMS}
	for _, st := range steps {
		if st.Name == agentStep {
			p.AgentMS, p.IdentityMS = st.DurationMS, c.ReadyMS-c.RunningMS-st.DurationMS
		}
	}
	t0, ok1 := e.events.first(frozenMessage, "", "")
	// Not qmp_capabilities: QEMU greets before it has finished starting,
	// and answers that first command only then.
	qmpUp, ok2 := e.events.first(qmpMessage, c.Name, "migrate-set-capabilities")
	loaded, ok3 := e.events.first(qmpMessage, c.Name, "set_link")
	if ok1 && ok2 && ok3 {
		p.QEMUStartMS, p.LoadMS, p.ContMS = ms(qmpUp.Sub(t0)), ms(loaded.Sub(qmpUp)), c.RunningMS-ms(loaded.Sub(t0))
	}
	return p
}

// coldBoot boots the same guest from scratch to the same "agent answers"
// point, reads its memory and removes it.
func (e *Env) coldBoot(ctx context.Context, name string, mem int) (s Sample, err error) {
	m, d, err := e.boot(ctx, name, mem)
	if err != nil {
		return s, err
	}
	defer func() { err = errors.Join(err, e.remove(context.WithoutCancel(ctx), name)) }()
	s.ReadyMS, s.AgentMS = ms(d), ms(d)
	return e.finishSample(ctx, s, pidMemory(m.PID, mem))
}

// summarize takes the medians of each method's samples, in methods' order.
func summarize(samples []Sample, methods []Method) []Summary {
	var out []Summary
	for _, m := range methods {
		var run, ready, agent, pss, pause, wall, idle []float64
		var mem [4][]float64
		var ph [8][]float64
		var steps []Step
		stepMS := map[string][]float64{}
		n := 0
		for _, s := range samples {
			if s.Method != m {
				continue
			}
			n++
			run, ready, agent = appendSet(run, s.RunningMS), appendSet(ready, s.ReadyMS), appendSet(agent, s.AgentMS)
			for _, st := range s.Steps {
				if _, seen := stepMS[st.Name]; !seen {
					steps = append(steps, Step{Name: st.Name, Status: st.Status})
				}
				stepMS[st.Name] = append(stepMS[st.Name], st.DurationMS)
			}
			pss, pause, wall = appendSet(pss, float64(s.PSSBytes)), appendSet(pause, s.PauseMS), appendSet(wall, s.WallMS)
			idle = appendSet(idle, float64(s.PoolIdlePSSBytes))
			for i, v := range []int64{s.Memory.GuestRAMBytes, s.Memory.TCGBytes, s.Memory.AnonBytes, s.Memory.FileBytes} {
				mem[i] = append(mem[i], float64(v))
			}
			for i, v := range phaseValues(s.Phases) {
				ph[i] = appendSet(ph[i], v)
			}
		}
		if n == 0 {
			continue
		}
		for i := range steps {
			steps[i].DurationMS = Median(stepMS[steps[i].Name])
		}
		out = append(out, Summary{
			Method: m, Label: m.Label(), Samples: n,
			RunningMS: Median(run), ReadyMS: Median(ready), AgentMS: Median(agent), PSSBytes: int64(Median(pss)),
			PauseMS: Median(pause), WallMS: Median(wall), Steps: steps, PoolIdle: int64(Median(idle)),
			Memory: Memory{GuestRAMBytes: int64(Median(mem[0])), TCGBytes: int64(Median(mem[1])),
				AnonBytes: int64(Median(mem[2])), FileBytes: int64(Median(mem[3]))},
			Phases: Phases{
				QEMUStartMS: Median(ph[0]), LoadMS: Median(ph[1]), ContMS: Median(ph[2]), AgentMS: Median(ph[3]),
				IdentityMS: Median(ph[4]), SaveMS: Median(ph[5]), CopyMS: Median(ph[6]), RestoreMS: Median(ph[7]),
			},
		})
	}
	return out
}

func phaseValues(p Phases) [8]float64 {
	return [8]float64{p.QEMUStartMS, p.LoadMS, p.ContMS, p.AgentMS, p.IdentityMS, p.SaveMS, p.CopyMS, p.RestoreMS}
}

// appendSet appends v unless it is 0 (not measured).
func appendSet(s []float64, v float64) []float64 {
	if v == 0 {
		return s
	}
	return append(s, v)
}

func find(ss []Summary, m Method) Summary {
	for _, s := range ss {
		if s.Method == m {
			return s
		}
	}
	return Summary{}
}

// atLeast and atMost build a ratio with a target; a zero value (a method not
// measured) gives no ratio.
func atLeast(name string, v, target float64) Ratio {
	met := v >= target
	r := Ratio{Name: name, Value: v, Target: fmt.Sprintf(">= %g", target), Met: &met}
	if !met && v > 0 {
		r.By = target / v
	}
	return r
}

func atMost(name string, v, target float64) Ratio {
	met := v <= target
	r := Ratio{Name: name, Value: v, Target: fmt.Sprintf("<= %g", target), Met: &met}
	if !met && target > 0 {
		r.By = v / target
	}
	return r
}

func info(name string, v float64) Ratio { return Ratio{Name: name, Value: v} }

// peerRatios are the targets (vmfork against each reference) and
// the informative ratios next to them.
func peerRatios(ss []Summary) []Ratio {
	vf, fl, wp := find(ss, MethodVmfork), find(ss, MethodFloor), find(ss, MethodWarm)
	lv, cb := find(ss, MethodRestore), find(ss, MethodCold)
	var out []Ratio
	add := func(r Ratio) {
		if r.Value != 0 {
			out = append(out, r)
		}
	}
	add(atLeast("child ready: libvirt restore / vmfork", Factor(lv.ReadyMS, vf.ReadyMS), 10))
	add(atLeast("agent answers: libvirt restore / vmfork", Factor(lv.AgentMS, vf.AgentMS), 10))
	add(atLeast("child PSS: libvirt restore / vmfork", Factor(float64(lv.PSSBytes), float64(vf.PSSBytes)), 10))
	add(atMost("child running: vmfork / floor", Factor(vf.RunningMS, fl.RunningMS), 1.25))
	add(info("agent answers: vmfork / floor", Factor(vf.AgentMS, fl.AgentMS)))
	add(atLeast("child ready: libvirt restore / warm pool", Factor(lv.ReadyMS, wp.ReadyMS), 10))
	add(atLeast("child PSS: libvirt restore / warm pool", Factor(float64(lv.PSSBytes), float64(wp.PSSBytes)), 10))
	add(info("source pause: libvirt save+restore / vmfork", Factor(lv.PauseMS, vf.PauseMS)))
	add(info("whole clone: libvirt / vmfork", Factor(lv.WallMS, vf.WallMS)))
	add(info("child ready: cold boot / vmfork", Factor(cb.ReadyMS, vf.ReadyMS)))
	add(info("child PSS: cold boot / vmfork", Factor(float64(cb.PSSBytes), float64(vf.PSSBytes))))
	return out
}

// memLabel prints a RAM size the way the flags take it.
func memLabel(mib int) string {
	if mib%1024 == 0 {
		return fmt.Sprintf("%dG", mib/1024)
	}
	return fmt.Sprintf("%dM", mib)
}
