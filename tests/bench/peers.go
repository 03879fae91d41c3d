package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/sharedmem"
)

// Method is one way of making a running copy of a guest.
type Method string

// The comparators of `vmfork bench peers`, in the order of a round's
// rotation. vmfork comes first so that the first round makes the template
// the floor loads.
const (
	MethodVmfork  Method = "vmfork"
	MethodFloor   Method = "floor"
	MethodKept    Method = "kept_template"
	MethodRestore Method = "libvirt_restore"
	MethodCold    Method = "cold_boot"
	// MethodLibvirtDriver forks a source booted through vmfork's libvirt
	// driver; MethodLibvirtCreate is its reference, libvirt's own start of
	// the same child XML (lvfork.go). The second comes with the first.
	MethodLibvirtDriver Method = "libvirt_driver"
	MethodLibvirtCreate Method = "libvirt_create_paused"
)

// allMethods is every method in the order of a round's rotation. Each
// method that uses another's child (the floor loads a vmfork child's
// template, create --paused a libvirt driver child's XML)
// comes after it, so the first round has that child.
var allMethods = []Method{MethodVmfork, MethodFloor, MethodKept, MethodRestore, MethodCold, MethodLibvirtDriver, MethodLibvirtCreate}

// ParseMethods reads --methods: method names separated by commas, "all", or
// "" (all). libvirt_driver brings libvirt_create_paused with it. The
// result is in rotation order; Peers checks what each method needs.
func ParseMethods(s string) ([]Method, error) {
	if t := strings.TrimSpace(s); t == "" || t == "all" {
		return nil, nil
	}
	want := map[Method]bool{}
	for _, f := range strings.Split(s, ",") {
		m := Method(strings.TrimSpace(f))
		if m == MethodLibvirtCreate || !slices.Contains(allMethods, m) {
			var names []string
			for _, a := range allMethods {
				if a != MethodLibvirtCreate {
					names = append(names, string(a))
				}
			}
			return nil, fmt.Errorf("method %q: want some of %s: %w", f, strings.Join(names, ","), vmfork.ErrInvalid)
		}
		want[m] = true
	}
	want[MethodLibvirtCreate] = want[MethodLibvirtDriver]
	for _, m := range []Method{MethodFloor} {
		if want[m] && !want[MethodVmfork] {
			return nil, fmt.Errorf("method %s loads the template of a vmfork child: add vmfork: %w", m, vmfork.ErrInvalid)
		}
	}
	var out []Method
	for _, m := range allMethods {
		if want[m] {
			out = append(out, m)
		}
	}
	return out, nil
}

// peerMethods is what a run measures: the requested methods (nil: all),
// without libvirt's when there is no libvirt. Asking for a libvirt method
// without libvirt is an error.
func peerMethods(requested []Method, libvirt bool) ([]Method, error) {
	explicit := requested != nil
	if !explicit {
		requested = allMethods
	}
	var out []Method
	for _, m := range requested {
		if m.libvirt() && !libvirt {
			if explicit {
				return nil, fmt.Errorf("method %s needs libvirt (leave out --no-libvirt): %w", m, vmfork.ErrInvalid)
			}
			continue
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no method to measure: %w", vmfork.ErrInvalid)
	}
	return out, nil
}

func (m Method) libvirt() bool {
	return m == MethodRestore || m == MethodLibvirtDriver || m == MethodLibvirtCreate
}

// Label is the method's name in tables and plots.
func (m Method) Label() string {
	switch m {
	case MethodVmfork:
		return "vmfork fork (live source)"
	case MethodFloor:
		return "floor: bare QEMU -incoming"
	case MethodKept:
		return "vmfork kept template + pool"
	case MethodRestore:
		return "libvirt save + restore"
	case MethodCold:
		return "cold boot"
	case MethodLibvirtDriver:
		return "vmfork fork, libvirt driver"
	case MethodLibvirtCreate:
		return "virsh create --paused (its XML)"
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
	// PoolIdlePSSBytes is what a warm-pool QEMU of a kept template holds
	// while it waits.
	PoolIdlePSSBytes int64 `json:"pool_idle_pss_bytes,omitempty"`
	// PauseMS is how long the source did not run: vmfork's freeze, or
	// libvirt's save plus the restore that brings the source back.
	PauseMS float64 `json:"source_pause_ms,omitempty"`
	// WallMS is the whole clone operation, source's part included.
	WallMS        float64 `json:"wall_ms,omitempty"`
	SaveFileBytes int64   `json:"save_file_bytes,omitempty"`
	// TemplateRAMBytes is what a fork's freeze copied: the allocated part of
	// its template's RAM file.
	TemplateRAMBytes int64  `json:"template_ram_bytes,omitempty"`
	Phases           Phases `json:"phases"`
	Steps            []Step `json:"identity_steps,omitempty"`
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
	// SaveFileBytes is virsh save's file; TemplateRAMBytes what a fork's
	// freeze copied. Both grow with what the guest uses.
	SaveFileBytes    int64  `json:"save_file_bytes,omitempty"`
	TemplateRAMBytes int64  `json:"template_ram_bytes,omitempty"`
	Phases           Phases `json:"phases"`
	Steps            []Step `json:"identity_steps,omitempty"`
}

// Ratio compares vmfork with a reference. Met is nil where there is no target.
type Ratio struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Target string  `json:"target,omitempty"`
	Met    *bool   `json:"met,omitempty"`
	// By is how far the value is from the target, as a factor (> 1 when
	// missed); for a difference (Unit "ms"), in the unit.
	By float64 `json:"missed_by,omitempty"`
	// Unit is "ms" for a difference of times; empty for a ratio.
	Unit string `json:"unit,omitempty"`
}

// PeersSize is the comparison at one guest RAM size.
type PeersSize struct {
	MemoryMiB    int     `json:"memory_mib"`
	SourceBootMS float64 `json:"source_boot_ms"`
	// KeptPauseMS is the source's pause when its instant was kept for the
	// kept-template method: paid once, not per child.
	KeptPauseMS   float64 `json:"kept_pause_ms,omitempty"`
	LibvirtBootMS float64 `json:"libvirt_boot_ms,omitempty"`
	// LibvirtDriverBootMS is the boot of the libvirt driver's source.
	LibvirtDriverBootMS float64 `json:"libvirt_driver_boot_ms,omitempty"`
	SourceRSSBytes      int64   `json:"source_rss_bytes"`
	// GuestUseMiB is what each source guest was filled with before the
	// rounds (--guest-use), and Fills how each got it. A cold boot starts
	// empty: it cannot carry the fill.
	GuestUseMiB int       `json:"guest_use_mib"`
	Fills       []Fill    `json:"guest_use_fills,omitempty"`
	Summary     []Summary `json:"summary"`
	Ratios      []Ratio   `json:"ratios"`
	Samples     []Sample  `json:"samples"`
}

// PeersResult is `vmfork bench peers`.
type PeersResult struct {
	Host     Host        `json:"host"`
	Rounds   int         `json:"rounds"`
	SettleMS float64     `json:"settle_ms"`
	GuestUse GuestUse    `json:"guest_use"`
	Methods  []Method    `json:"methods"`
	Sizes    []PeersSize `json:"sizes"`
}

// PeersOptions choose the sizes, the number of rounds, the methods and how
// much RAM the source guests use.
type PeersOptions struct {
	MemoryMiB []int    // default 512 and 2048
	Rounds    int      // default 5
	Methods   []Method // nil: all (libvirt's only with libvirt)
	GuestUse  GuestUse // zero: the guests as they boot
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
	methods, err := peerMethods(opt.Methods, e.cfg.LibvirtURI != "")
	if err != nil {
		return nil, err
	}
	// Everything that can fail without booting anything fails first.
	for _, mem := range opt.MemoryMiB {
		if _, err := opt.GuestUse.MiBFor(mem); err != nil {
			return nil, err
		}
	}
	if slices.Contains(methods, MethodLibvirtDriver) {
		if err := e.checkLibvirtHook(ctx); err != nil {
			return nil, err
		}
		if _, err := e.libvirtManager(); err != nil {
			return nil, err
		}
	}
	res := &PeersResult{Rounds: opt.Rounds, SettleMS: ms(e.cfg.Settle), GuestUse: opt.GuestUse, Methods: methods}
	e.begin(len(opt.MemoryMiB) * (3 + opt.Rounds*len(methods)))
	for _, mem := range opt.MemoryMiB {
		sz, err := e.peersAt(ctx, mem, opt, methods)
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

func (e *Env) peersAt(ctx context.Context, mem int, opt PeersOptions, methods []Method) (sz *PeersSize, err error) {
	sz = &PeersSize{MemoryMiB: mem}
	if sz.GuestUseMiB, err = opt.GuestUse.MiBFor(mem); err != nil {
		return nil, err
	}
	src := fmt.Sprintf("src%d", mem)
	e.announce("peers %s: booting the source", memLabel(mem))
	m, bootD, err := e.boot(ctx, src, mem)
	if err != nil {
		return nil, err
	}
	sz.SourceBootMS = ms(bootD)
	ps := &peerSources{src: src, lvSrc: lvName("drv", mem), mem: mem}
	defer func() {
		// Children first: a template goes with its last child.
		rctx := context.WithoutCancel(ctx)
		err = errors.Join(err, e.remove(rctx, ps.children...), e.remove(rctx, src))
	}()
	if err := e.fill(ctx, sz, managerRunner(e.mgr, src), MethodVmfork, src); err != nil {
		return sz, err
	}
	if slices.Contains(methods, MethodKept) {
		if err := e.keepSource(ctx, sz, src); err != nil {
			return sz, err
		}
		// Runs before the removals deferred above; each kept child is
		// removed in its round, so the template goes at once.
		defer func() { err = errors.Join(err, e.unkeep(context.WithoutCancel(ctx), mem)) }()
	}
	e.step("peers %s: source booted", memLabel(mem))
	if slices.Contains(methods, MethodRestore) {
		e.announce("peers %s: booting the libvirt domain", memLabel(mem))
		// Not :=, here and below: the deferred removals must set the
		// function's err, not a shadow of it.
		var dom *libvirtDomain
		var d time.Duration
		if dom, d, err = e.createDomain(ctx, mem, m.Spec.MachineType); err != nil {
			return sz, fmt.Errorf("libvirt domain: %w", err)
		}
		ps.dom, sz.LibvirtBootMS = dom, ms(d)
		defer func() { err = errors.Join(err, e.destroyDomain(context.WithoutCancel(ctx), dom.name)) }()
		if err := e.fill(ctx, sz, e.domainRunner(dom.name), MethodRestore, dom.name); err != nil {
			return sz, err
		}
	}
	e.step("peers %s: libvirt domain booted", memLabel(mem))
	lvSrc := ps.lvSrc
	if slices.Contains(methods, MethodLibvirtDriver) {
		e.announce("peers %s: booting the libvirt driver's source", memLabel(mem))
		var d time.Duration
		if _, d, err = e.bootLibvirtSource(ctx, lvSrc, mem); err != nil {
			return sz, err
		}
		sz.LibvirtDriverBootMS = ms(d)
		defer func() {
			rctx := context.WithoutCancel(ctx)
			err = errors.Join(err, e.removeLibvirt(rctx, append(ps.lvChildren, lvSrc)...))
		}()
		if err := e.fill(ctx, sz, managerRunner(e.lv, lvSrc), MethodLibvirtDriver, lvSrc); err != nil {
			return sz, err
		}
	}
	e.step("peers %s: libvirt driver's source booted", memLabel(mem))
	if err := e.peerRounds(ctx, sz, opt, methods, ps); err != nil {
		return sz, err
	}
	if r, err := sharedmem.ReadRollup(m.PID); err == nil {
		sz.SourceRSSBytes = r.RSS
	}
	sz.Summary = summarize(sz.Samples, methods)
	if sz.GuestUseMiB > 0 {
		for i := range sz.Summary {
			if sz.Summary[i].Method == MethodCold {
				sz.Summary[i].Label += " (empty guest)"
			}
		}
	}
	sz.Ratios = peerRatios(sz.Summary)
	return sz, nil
}

// peerSources are what one size's rounds fork from, and the children they
// made so far: the last of each stays for the next round's floor and
// create --paused, and the caller removes what is left.
type peerSources struct {
	src, lvSrc           string
	mem                  int
	dom                  *libvirtDomain
	children, lvChildren []string
}

// peerRounds measures each method opt.Rounds times, rotating their order
// each round.
func (e *Env) peerRounds(ctx context.Context, sz *PeersSize, opt PeersOptions, methods []Method, ps *peerSources) error {
	for r := range opt.Rounds {
		for i := range methods {
			meth := methods[(i+r)%len(methods)]
			e.announce("peers %s round %d/%d: %s", memLabel(ps.mem), r+1, opt.Rounds, meth.Label())
			s, err := e.peerSample(ctx, meth, r+1, ps)
			if err != nil {
				return fmt.Errorf("round %d: %s: %w", r+1, meth.Label(), err)
			}
			s.Method, s.Round = meth, r+1
			sz.Samples = append(sz.Samples, s)
			e.step("peers %s round %d/%d: %s done in %.0f ms", memLabel(ps.mem), r+1, opt.Rounds, meth.Label(), max(s.ReadyMS, s.RunningMS))
		}
	}
	return nil
}

// peerSample measures method meth once, in round (from 1).
func (e *Env) peerSample(ctx context.Context, meth Method, round int, ps *peerSources) (s Sample, err error) {
	last, lvLast := lastOf(ps.children), lastOf(ps.lvChildren)
	switch meth {
	case MethodVmfork:
		var child string
		s, child, err = e.forkOne(ctx, ps.src)
		ps.children, err = keepLast(ctx, ps.children, child, err, e.remove)
	case MethodFloor:
		s, err = e.floor(ctx, last)
	case MethodKept:
		s, err = e.forkKept(ctx, keptName(ps.mem))
	case MethodRestore:
		s, err = e.saveRestore(ctx, ps.dom)
	case MethodCold:
		s, err = e.coldBoot(ctx, fmt.Sprintf("cold%d-%d", ps.mem, round), ps.mem)
	case MethodLibvirtDriver:
		var child string
		s, child, err = e.forkLibvirt(ctx, ps.lvSrc)
		ps.lvChildren, err = keepLast(ctx, ps.lvChildren, child, err, e.removeLibvirt)
	case MethodLibvirtCreate:
		s, err = e.createPaused(ctx, lvLast, lvName("create", ps.mem)+"-"+strconv.Itoa(round))
	}
	return s, err
}

func lastOf(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return names[len(names)-1]
}

// keepLast records a new fork child and removes the one before it: one
// child at a time, but the previous one goes only now, since the methods
// run since (the floor, create --paused) may have used it.
func keepLast(ctx context.Context, children []string, child string, err error, remove func(context.Context, ...string) error) ([]string, error) {
	if child != "" {
		children = append(children, child)
	}
	if err == nil && len(children) > 1 {
		err = remove(ctx, children[0])
		children = children[1:]
	}
	return children, err
}

// fill gives a source guest the run's guest use, if any, and notes it.
func (e *Env) fill(ctx context.Context, sz *PeersSize, run guestRunner, method Method, guest string) error {
	if sz.GuestUseMiB == 0 {
		return nil
	}
	e.announce("peers %s: filling %d MiB of %s", memLabel(sz.MemoryMiB), sz.GuestUseMiB, guest)
	f, err := fillGuest(ctx, run, method, guest, sz.GuestUseMiB)
	sz.Fills = append(sz.Fills, f)
	return err
}

// forkOne forks one child of src and reads its memory once it settled.
func (e *Env) forkOne(ctx context.Context, src string) (Sample, string, error) {
	e.events.reset(nil)
	f, err := forkSample(e.events.attach(ctx), e.mgr, src)
	if err != nil {
		return f.Sample, f.name, err
	}
	s := f.Sample
	s.Phases = e.forkPhases(f.child, s.Steps)
	s.AgentMS = f.child.RunningMS + s.Phases.AgentMS
	s, err = e.finishSample(ctx, s, func() (Memory, error) { return readMemory(f.child.PID, f.ram, f.size) })
	return s, f.name, err
}

// forked is one child made by Manager.Fork, with its sample so far.
type forked struct {
	Sample
	child vmfork.ChildResult
	name  string // the child's, also of a failed one, for the cleanup
	ram   string // its template's RAM file
	size  int64  // its guest RAM size
}

// forkSample forks one child of src through mg and fills the times a
// ForkResult gives: running, ready, the source's pause, the whole call, the
// identity steps (phases and agent time are the caller's).
func forkSample(ctx context.Context, mg *vmfork.Manager, src string) (forked, error) {
	start := time.Now()
	res, err := mg.Fork(ctx, vmfork.ForkRequest{Source: src, Count: 1})
	wall := time.Since(start)
	if res == nil || len(res.Children) == 0 {
		if err == nil {
			err = errors.New("fork returned no child")
		}
		if res != nil && len(res.Failed) > 0 {
			return forked{name: res.Failed[0].Name}, err
		}
		return forked{}, err
	}
	c := res.Children[0]
	f := forked{child: c, name: c.Name}
	if err != nil {
		return f, err
	}
	f.Sample = Sample{RunningMS: c.RunningMS, ReadyMS: c.ReadyMS, PauseMS: res.PauseMS, WallMS: ms(wall)}
	f.Steps = identitySteps(c.Identity)
	// A delta template's child maps its base (vmfork's delta.go); what the
	// template holds of its own is then the delta alone.
	tpl, err := mg.Store.LoadTemplate(res.Template)
	if err != nil {
		return f, err
	}
	f.ram = tpl.MappedRAM()
	f.TemplateRAMBytes = allocatedBytes(f.ram)
	if tpl.RAMDelta != nil {
		f.TemplateRAMBytes = allocatedBytes(tpl.RAMDelta.Pages)
	}
	// The child's record, not the source's: src may name a kept template.
	m, err := mg.Store.LoadMachine(c.Name)
	if err != nil {
		return f, err
	}
	f.size = int64(m.Spec.MemoryMiB) << 20
	return f, nil
}

// forkPhases splits a fork child's time at the moments its fork's trace
// reported (forkEvents): the child's start, its QEMU answering
// qmp_capabilities (QEMU greets before it has finished starting, and
// answers that first command only then), its device state loaded, and
// vmfork's own running and ready figures. QEMU START then includes the
// overlay and the records, which the floor does not have. Zero phases when
// a moment is missing (a pool member's QEMU was up before the fork).
func (e *Env) forkPhases(c vmfork.ChildResult, steps []Step) Phases {
	p := identityPhases(c, steps)
	t0, ok1 := e.events.childStart(c.Name)
	qmpUp, ok2 := e.events.phase(c.Name, vmfork.PhaseQMPReady)
	loaded, ok3 := e.events.phase(c.Name, vmfork.PhaseStateLoaded)
	if ok1 && ok2 && ok3 {
		p.QEMUStartMS, p.LoadMS, p.ContMS = ms(qmpUp.Sub(t0)), ms(loaded.Sub(qmpUp)), c.RunningMS-ms(loaded.Sub(t0))
	}
	return p
}

// identityPhases splits a fork child's time after running: the agent
// step, then the rest of the identity chain.
func identityPhases(c vmfork.ChildResult, steps []Step) Phases {
	p := Phases{AgentMS: c.ReadyMS - c.RunningMS}
	for _, st := range steps {
		if st.Name == agentStep {
			p.AgentMS, p.IdentityMS = st.DurationMS, c.ReadyMS-c.RunningMS-st.DurationMS
		}
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
		var run, ready, agent, pss, pause, wall, idle, save, tpl []float64
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
			save, tpl = appendSet(save, float64(s.SaveFileBytes)), appendSet(tpl, float64(s.TemplateRAMBytes))
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
			SaveFileBytes: int64(Median(save)), TemplateRAMBytes: int64(Median(tpl)),
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

// atMostMS is a difference of times with a limit in ms.
func atMostMS(name string, v, limit float64) Ratio {
	met := v <= limit
	r := Ratio{Name: name, Value: v, Target: fmt.Sprintf("<= %+g ms", limit), Met: &met, Unit: "ms"}
	if !met {
		r.By = v - limit
	}
	return r
}

func info(name string, v float64) Ratio { return Ratio{Name: name, Value: v} }

// peerRatios are the targets (vmfork against each reference) and
// the informative ratios next to them.
func peerRatios(ss []Summary) []Ratio {
	vf, fl, kt := find(ss, MethodVmfork), find(ss, MethodFloor), find(ss, MethodKept)
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
	// A kept template with a warm pool: the "kept-template case".
	add(atLeast("child ready: libvirt restore / kept template", Factor(lv.ReadyMS, kt.ReadyMS), 10))
	add(atLeast("agent answers: libvirt restore / kept template", Factor(lv.AgentMS, kt.AgentMS), 10))
	add(atLeast("child PSS: libvirt restore / kept template", Factor(float64(lv.PSSBytes), float64(kt.PSSBytes)), 10))
	add(info("child running: kept template / floor", Factor(kt.RunningMS, fl.RunningMS)))
	add(info("source pause: libvirt save+restore / vmfork", Factor(lv.PauseMS, vf.PauseMS)))
	add(info("whole clone: libvirt / vmfork", Factor(lv.WallMS, vf.WallMS)))
	add(info("child ready: cold boot / vmfork", Factor(cb.ReadyMS, vf.ReadyMS)))
	add(info("child PSS: cold boot / vmfork", Factor(float64(cb.PSSBytes), float64(vf.PSSBytes))))
	// The libvirt driver against libvirt's own ways, same guest, RAM and use.
	lvd, lvc := find(ss, MethodLibvirtDriver), find(ss, MethodLibvirtCreate)
	add(atLeast("child ready: libvirt restore / libvirt driver", Factor(lv.ReadyMS, lvd.ReadyMS), 10))
	add(atLeast("agent answers: libvirt restore / libvirt driver", Factor(lv.AgentMS, lvd.AgentMS), 10))
	add(atLeast("child PSS: libvirt restore / libvirt driver", Factor(float64(lv.PSSBytes), float64(lvd.PSSBytes)), 10))
	if lvd.RunningMS > 0 && lvc.RunningMS > 0 {
		add(atMostMS("child running: libvirt driver - virsh create --paused", lvd.RunningMS-lvc.RunningMS, 100))
	}
	add(info("child running: libvirt driver / virsh create --paused", Factor(lvd.RunningMS, lvc.RunningMS)))
	add(info("source pause: libvirt save+restore / libvirt driver", Factor(lv.PauseMS, lvd.PauseMS)))
	add(info("child PSS: libvirt driver / vmfork", Factor(float64(lvd.PSSBytes), float64(vf.PSSBytes))))
	return out
}

// memLabel prints a RAM size the way the flags take it.
func memLabel(mib int) string {
	if mib%1024 == 0 {
		return fmt.Sprintf("%dG", mib/1024)
	}
	return fmt.Sprintf("%dM", mib)
}
