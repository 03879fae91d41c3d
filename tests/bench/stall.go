package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/vmfork/vmfork"
)

// `vmfork bench stall` measures two targets of the flat pause (issue 11)
// that a pause figure alone does not show:
//
//   - the stall a client of the source sees: a host client exchanging a byte
//     with an echo service in the source every Interval (echo.go), through
//     a port forward, during a fork and during the floor (stop, device-state
//     save with x-ignore-shared, cont of the same source: pauseFloor), in the
//     same rounds; the longest gap between replies of each, next to that of
//     a quiet window in which nothing happens;
//   - the whole clone: the fork call until its first child is READY, next
//     to `virsh save` + `virsh restore` of a libvirt domain of the same
//     guest, RAM and use until its agent answers (saveRestore).
//
// The sizes run one after another, and at each size the vmfork source is
// removed before the libvirt domain boots: a 4 GiB guest holding 3 GiB is
// heavy, and two of them at once would measure the host's memory pressure.

// echoPort is the guest port of the echo service: busybox nc, persistent
// (-ll), with cat on each connection, so one byte in is one byte out.
const echoPort = 7777

// echoService starts it detached from the agent's exec (whose exec waits for
// stdout and stderr to close).
var echoService = []string{"/bin/sh", "-c", "setsid nc -ll -p " + strconv.Itoa(echoPort) + " -e /bin/cat </dev/null >/dev/null 2>&1 &"}

// StallOptions choose the sources, the rounds and the client.
type StallOptions struct {
	MemoryMiB []int      // default 512 and 4096
	GuestUse  []GuestUse // one per MemoryMiB entry, or one for all; default none and 3 GiB
	Rounds    int        // default 3
	// Interval is how often the client sends a byte; default 2 ms.
	Interval time.Duration
	// Tail is how long a window stays open after the fork (or the floor)
	// returned: the client's stall may outlast the call (page faults after
	// the resume). Default 500 ms.
	Tail time.Duration
	// Quiet is the length of the window with nothing happening measured in
	// each round: the client's own noise on this host. Default 1 s.
	Quiet time.Duration
	// Driver is the vmfork driver the source is booted and forked through:
	// DriverEmbedded (default) or DriverLibvirt, whose floor is the same
	// calls its freeze makes (pauseFloorLibvirt).
	Driver string
}

// The drivers `bench stall` forks through.
const (
	DriverEmbedded = "embedded"
	DriverLibvirt  = "libvirt"
)

func (o *StallOptions) defaults() {
	if len(o.MemoryMiB) == 0 {
		o.MemoryMiB = []int{512, 4096}
		if len(o.GuestUse) == 0 {
			o.GuestUse = []GuestUse{{}, {MiB: 3072}}
		}
	}
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.Interval <= 0 {
		o.Interval = 2 * time.Millisecond
	}
	if o.Tail <= 0 {
		o.Tail = 500 * time.Millisecond
	}
	if o.Quiet <= 0 {
		o.Quiet = time.Second
	}
	if o.Driver == "" {
		o.Driver = DriverEmbedded
	}
}

// useFor is the fill of the i-th size.
func (o StallOptions) useFor(i, mem int) (int, error) {
	switch {
	case len(o.GuestUse) == 0:
		return 0, nil
	case len(o.GuestUse) == 1:
		return o.GuestUse[0].MiBFor(mem)
	case len(o.GuestUse) == len(o.MemoryMiB):
		return o.GuestUse[i].MiBFor(mem)
	}
	return 0, fmt.Errorf("%d guest-use values for %d RAM sizes: %w", len(o.GuestUse), len(o.MemoryMiB), vmfork.ErrInvalid)
}

// StallRound is one round at one size: a quiet window, the floor and a fork,
// each seen by the same client.
type StallRound struct {
	Round int  `json:"round"`
	Quiet Gaps `json:"quiet"`
	Floor Gaps `json:"floor"`
	// FloorPauseMS is the floor's pause as the harness timed it (stop
	// until cont returned).
	FloorPauseMS float64 `json:"floor_pause_ms"`
	Fork         Gaps    `json:"fork"`
	// ForkAcrossPauseMS is the longest gap that overlaps the fork's pause
	// (as its trace reported it): the part of the stall the pause made.
	ForkAcrossPauseMS float64 `json:"fork_gap_across_pause_ms"`
	ForkPauseMS       float64 `json:"fork_pause_ms"`
	RAMMode           string  `json:"ram_mode"`
	PrecopiedBytes    int64   `json:"precopied_bytes"`
	PausedCopyBytes   int64   `json:"paused_copy_bytes"`
	// CloneMS is the fork call until its first child was READY (the trace's
	// ChildReady), ChildReadyMS that child's own ready (from its start).
	CloneMS      float64 `json:"whole_clone_ms"`
	ChildReadyMS float64 `json:"child_ready_ms"`
}

// StallSize is one source size: its rounds, their medians, the libvirt
// save + restore of the same guest, and the targets.
type StallSize struct {
	MemoryMiB    int          `json:"memory_mib"`
	GuestUseMiB  int          `json:"guest_use_mib"`
	SourceBootMS float64      `json:"source_boot_ms"`
	Fills        []Fill       `json:"guest_use_fills,omitempty"`
	Rounds       []StallRound `json:"rounds"`

	QuietMaxGapMS     float64 `json:"quiet_max_gap_ms"`
	QuietP99GapMS     float64 `json:"quiet_p99_gap_ms"`
	FloorMaxGapMS     float64 `json:"floor_max_gap_ms"`
	FloorP99GapMS     float64 `json:"floor_p99_gap_ms"`
	FloorPauseMS      float64 `json:"floor_pause_ms"`
	ForkMaxGapMS      float64 `json:"fork_max_gap_ms"`
	ForkP99GapMS      float64 `json:"fork_p99_gap_ms"`
	ForkAcrossPauseMS float64 `json:"fork_gap_across_pause_ms"`
	ForkPauseMS       float64 `json:"fork_pause_ms"`
	CloneMS           float64 `json:"vmfork_whole_clone_ms"`

	// The libvirt domain of the same guest: save, restore, agent, in
	// medians; SaveRestoreMS is their sum (to the agent answering, no copy
	// of the save file), WithCopyMS the whole clone with the copy a second
	// machine would need.
	LibvirtBootMS float64  `json:"libvirt_boot_ms,omitempty"`
	Libvirt       []Sample `json:"libvirt_samples,omitempty"`
	SaveMS        float64  `json:"libvirt_save_ms,omitempty"`
	RestoreMS     float64  `json:"libvirt_restore_ms,omitempty"`
	AgentMS       float64  `json:"libvirt_agent_ms,omitempty"`
	SaveRestoreMS float64  `json:"libvirt_save_restore_ms,omitempty"`
	WithCopyMS    float64  `json:"libvirt_with_copy_ms,omitempty"`
	SaveFileBytes int64    `json:"save_file_bytes,omitempty"`

	Ratios []Ratio `json:"ratios"`
}

// StallResult is `vmfork bench stall`.
type StallResult struct {
	Host       Host        `json:"host"`
	Rounds     int         `json:"rounds"`
	IntervalMS float64     `json:"interval_ms"`
	TailMS     float64     `json:"tail_ms"`
	QuietMS    float64     `json:"quiet_ms"`
	Libvirt    bool        `json:"libvirt"`
	Driver     string      `json:"driver"`
	Sizes      []StallSize `json:"sizes"`
}

// Stall measures each size in turn. A partial result comes back with an
// error.
func Stall(ctx context.Context, e *Env, opt StallOptions) (*StallResult, error) {
	opt.defaults()
	lv := e.cfg.LibvirtURI != ""
	// Everything that can fail without booting anything fails first.
	uses := make([]int, len(opt.MemoryMiB))
	for i, mem := range opt.MemoryMiB {
		var err error
		if uses[i], err = opt.useFor(i, mem); err != nil {
			return nil, err
		}
	}
	if lv && e.host.Libvirt == "" {
		return nil, fmt.Errorf("libvirt at %s does not answer (scripts/libvirtd.sh starts one; --no-libvirt leaves it out): %w", e.cfg.LibvirtURI, vmfork.ErrInvalid)
	}
	drv, err := e.stallDriver(ctx, opt.Driver)
	if err != nil {
		return nil, err
	}
	res := &StallResult{Host: e.host, Rounds: opt.Rounds, IntervalMS: ms(opt.Interval), TailMS: ms(opt.Tail), QuietMS: ms(opt.Quiet), Libvirt: lv, Driver: opt.Driver}
	perSize := 2 + opt.Rounds
	if lv {
		perSize += 1 + opt.Rounds
	}
	e.begin(len(opt.MemoryMiB) * perSize)
	for i, mem := range opt.MemoryMiB {
		sz := &StallSize{MemoryMiB: mem, GuestUseMiB: uses[i]}
		machineType, err := e.stallVmfork(ctx, drv, sz, opt)
		if err == nil && lv {
			err = e.stallLibvirt(ctx, sz, opt, machineType)
		}
		sz.summarize()
		res.Host = e.host
		res.Sizes = append(res.Sizes, *sz)
		if err != nil {
			return res, fmt.Errorf("stall at %s: %w", memLabel(mem), err)
		}
	}
	return res, nil
}

// stallDrv is the vmfork driver a stall run forks through: its Manager, how
// its machines are removed, and its floor.
type stallDrv struct {
	name   string
	mgr    *vmfork.Manager
	remove func(ctx context.Context, names ...string) error
	floor  func(ctx context.Context, name string) (float64, error)
	// srcName names the source of a size: a libvirt domain name is
	// host-wide, so the libvirt driver's carries the run's pid.
	srcName func(mem int) string
	method  Method
}

// stallDriver resolves opt.Driver, checking before anything boots that the
// libvirt driver can start a child on this host.
func (e *Env) stallDriver(ctx context.Context, name string) (stallDrv, error) {
	switch name {
	case DriverEmbedded, "":
		return stallDrv{name: DriverEmbedded, mgr: e.mgr, remove: e.remove, floor: e.pauseFloor,
			srcName: func(mem int) string { return "stall" + strconv.Itoa(mem) }, method: MethodVmfork}, nil
	case DriverLibvirt:
		if e.cfg.LibvirtURI == "" {
			return stallDrv{}, fmt.Errorf("driver %s needs a libvirt URI (not --no-libvirt): %w", name, vmfork.ErrInvalid)
		}
		if err := e.checkLibvirtHook(ctx); err != nil {
			return stallDrv{}, err
		}
		lv, err := e.libvirtManager()
		if err != nil {
			return stallDrv{}, err
		}
		return stallDrv{name: DriverLibvirt, mgr: lv, remove: e.removeLibvirt, floor: e.pauseFloorLibvirt,
			srcName: func(mem int) string { return lvName("stall", mem) }, method: MethodLibvirtDriver}, nil
	}
	return stallDrv{}, fmt.Errorf("driver %q: want %s or %s: %w", name, DriverEmbedded, DriverLibvirt, vmfork.ErrInvalid)
}

// stallVmfork boots the source with its echo service and port forward,
// fills it, and runs the rounds with the client connected throughout. It
// returns the source's machine type, which the libvirt domain reuses.
func (e *Env) stallVmfork(ctx context.Context, drv stallDrv, sz *StallSize, opt StallOptions) (machineType string, err error) {
	mem := sz.MemoryMiB
	src := drv.srcName(mem)
	e.announce("stall %s: booting the source (%s driver)", memLabel(mem), drv.name)
	spec := e.spec(mem, guestAppend)
	spec.Ports = []vmfork.PortForward{{Guest: echoPort}}
	start := time.Now()
	m, err := drv.mgr.Boot(ctx, vmfork.BootRequest{Name: src, Spec: spec})
	if err != nil {
		return "", fmt.Errorf("%s driver: boot %s: %w", drv.name, src, err)
	}
	sz.SourceBootMS = ms(time.Since(start))
	if e.host.Accel == "" {
		e.host.Accel = m.Accel
	}
	defer func() { err = errors.Join(err, drv.remove(context.WithoutCancel(ctx), src)) }()
	if sz.GuestUseMiB > 0 {
		e.announce("stall %s: filling %s with %s of non-zero data", memLabel(mem), src, memLabel(sz.GuestUseMiB))
		f, err := fillGuest(ctx, managerRunner(drv.mgr, src), drv.method, src, sz.GuestUseMiB)
		sz.Fills = append(sz.Fills, f)
		if err != nil {
			return "", err
		}
	}
	if st, err := drv.mgr.Exec(ctx, src, vmfork.ExecRequest{Argv: echoService}); err != nil || st.ExitCode != 0 {
		return "", fmt.Errorf("start the echo service in %s: exit %d: %w", src, st.ExitCode, err)
	}
	if len(m.Spec.Ports) != 1 || m.Spec.Ports[0].Host == 0 {
		return "", fmt.Errorf("source %s has no host port for its echo service: %v", src, m.Spec.Ports)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Spec.Ports[0].Host))
	c, err := dialEcho(ctx, addr, opt.Interval, time.Minute)
	if err != nil {
		return "", fmt.Errorf("source %s: %w", src, err)
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	e.step("stall %s: source booted, its client connected to %s", memLabel(mem), addr)
	for r := 1; r <= opt.Rounds; r++ {
		rd, err := e.stallRound(ctx, drv, c, src, r, opt)
		sz.Rounds = append(sz.Rounds, rd)
		if err != nil {
			return "", fmt.Errorf("round %d: %w", r, err)
		}
		e.step("stall %s round %d/%d: client's longest gap %s in the floor, %s in the fork", memLabel(mem), r, opt.Rounds,
			fmtMS(rd.Floor.MaxGapMS), fmtMS(rd.Fork.MaxGapMS))
	}
	e.step("stall %s: rounds done", memLabel(mem))
	return m.Spec.MachineType, nil
}

// stallRound measures a quiet window, then the floor and a fork in an order
// that alternates between rounds, so neither always runs on a warmer host.
func (e *Env) stallRound(ctx context.Context, drv stallDrv, c *echoClient, src string, round int, opt StallOptions) (rd StallRound, err error) {
	rd.Round = round
	t0 := time.Now()
	if err := sleepCtx(ctx, opt.Quiet); err != nil {
		return rd, err
	}
	replies, err := c.window()
	if err != nil {
		return rd, err
	}
	rd.Quiet = gapsIn(replies, t0, t0.Add(opt.Quiet))
	floor := func() error {
		e.announce("stall round %d: floor (stop, device state, cont)", round)
		t0 := time.Now()
		p, err := drv.floor(ctx, src)
		if err != nil {
			return err
		}
		rd.FloorPauseMS = p
		rd.Floor, err = windowAfter(ctx, c, t0, opt.Tail)
		return err
	}
	fork := func() error {
		e.announce("stall round %d: fork", round)
		return e.stallFork(ctx, drv, c, src, round, opt, &rd)
	}
	steps := []func() error{floor, fork}
	if round%2 == 0 {
		steps[0], steps[1] = fork, floor
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return rd, err
		}
	}
	return rd, nil
}

// windowAfter waits tail after an operation that began at t0 and returned
// now, and returns the client's gaps from t0 to then.
func windowAfter(ctx context.Context, c *echoClient, t0 time.Time, tail time.Duration) (Gaps, error) {
	end := time.Now().Add(tail)
	if err := sleepCtx(ctx, tail); err != nil {
		return Gaps{}, err
	}
	replies, err := c.window()
	if err != nil {
		return Gaps{}, err
	}
	return gapsIn(replies, t0, end), nil
}

// stallFork forks one child of src while the client runs, notes the
// client's gaps, the freeze and the whole clone's time, and removes the
// child.
func (e *Env) stallFork(ctx context.Context, drv stallDrv, c *echoClient, src string, round int, opt StallOptions, rd *StallRound) (err error) {
	var mu sync.Mutex
	var frozen vmfork.FrozenInfo
	var firstReady time.Time
	tctx := vmfork.WithForkTrace(ctx, &vmfork.ForkTrace{
		SourceFrozen: func(i vmfork.FrozenInfo) {
			mu.Lock()
			defer mu.Unlock()
			frozen = i
		},
		ChildReady: func(i vmfork.ChildReadyInfo) {
			mu.Lock()
			defer mu.Unlock()
			if firstReady.IsZero() {
				firstReady = i.At
			}
		},
	})
	child := src + "-c" + strconv.Itoa(round)
	t0 := time.Now()
	fr, ferr := drv.mgr.Fork(tctx, vmfork.ForkRequest{Source: src, Names: []string{child}})
	wall := time.Since(t0)
	// A failed child is removed by vmfork; whatever is left goes here.
	defer func() { err = errors.Join(err, drv.remove(context.WithoutCancel(ctx), child)) }()
	if ferr != nil {
		return ferr
	}
	if len(fr.Children) != 1 {
		return fmt.Errorf("fork of %s made %d children, want 1", src, len(fr.Children))
	}
	if rd.Fork, err = windowAfter(ctx, c, t0, opt.Tail); err != nil {
		return err
	}
	replies, err := c.window()
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	if frozen.At.IsZero() {
		return fmt.Errorf("fork of %s: its trace reported no freeze", src)
	}
	rd.ForkPauseMS, rd.RAMMode = ms(frozen.Pause), frozen.RAMMode
	rd.PrecopiedBytes, rd.PausedCopyBytes = frozen.PrecopiedBytes, frozen.RAMCopiedBytes
	// The trace fires once the source runs again and its template is
	// recorded: the pause lies within the Pause before that moment.
	rd.ForkAcrossPauseMS = gapAcross(replies, frozen.At.Add(-frozen.Pause), frozen.At)
	rd.CloneMS = ms(wall)
	if !firstReady.IsZero() {
		rd.CloneMS = ms(firstReady.Sub(t0))
	}
	rd.ChildReadyMS = fr.Children[0].ReadyMS
	return nil
}

// stallLibvirt boots a libvirt domain of the same guest and RAM, fills it
// alike and clones it the libvirt way opt.Rounds times (saveRestore).
func (e *Env) stallLibvirt(ctx context.Context, sz *StallSize, opt StallOptions, machineType string) (err error) {
	mem := sz.MemoryMiB
	e.announce("stall %s: booting the libvirt domain", memLabel(mem))
	dom, d, err := e.createDomain(ctx, mem, machineType)
	if err != nil {
		return fmt.Errorf("libvirt domain: %w", err)
	}
	sz.LibvirtBootMS = ms(d)
	defer func() { err = errors.Join(err, e.destroyDomain(context.WithoutCancel(ctx), dom.name)) }()
	if sz.GuestUseMiB > 0 {
		e.announce("stall %s: filling %s with %s of non-zero data", memLabel(mem), dom.name, memLabel(sz.GuestUseMiB))
		f, err := fillGuest(ctx, e.domainRunner(dom.name), MethodRestore, dom.name, sz.GuestUseMiB)
		sz.Fills = append(sz.Fills, f)
		if err != nil {
			return err
		}
	}
	e.step("stall %s: libvirt domain booted", memLabel(mem))
	for r := 1; r <= opt.Rounds; r++ {
		e.announce("stall %s round %d/%d: virsh save + restore", memLabel(mem), r, opt.Rounds)
		s, err := e.saveRestore(ctx, dom)
		s.Method, s.Round = MethodRestore, r
		sz.Libvirt = append(sz.Libvirt, s)
		if err != nil {
			return fmt.Errorf("round %d: libvirt save + restore: %w", r, err)
		}
		e.step("stall %s round %d/%d: virsh save + restore in %s", memLabel(mem), r, opt.Rounds, fmtMS(s.WallMS-s.Phases.CopyMS))
	}
	return nil
}

// summarize takes the medians of the rounds and sets the targets.
func (sz *StallSize) summarize() {
	med := func(f func(StallRound) float64) float64 {
		var v []float64
		for _, r := range sz.Rounds {
			v = appendSet(v, f(r))
		}
		return Median(v)
	}
	sz.QuietMaxGapMS, sz.QuietP99GapMS = med(func(r StallRound) float64 { return r.Quiet.MaxGapMS }), med(func(r StallRound) float64 { return r.Quiet.P99GapMS })
	sz.FloorMaxGapMS, sz.FloorP99GapMS = med(func(r StallRound) float64 { return r.Floor.MaxGapMS }), med(func(r StallRound) float64 { return r.Floor.P99GapMS })
	sz.FloorPauseMS = med(func(r StallRound) float64 { return r.FloorPauseMS })
	sz.ForkMaxGapMS, sz.ForkP99GapMS = med(func(r StallRound) float64 { return r.Fork.MaxGapMS }), med(func(r StallRound) float64 { return r.Fork.P99GapMS })
	sz.ForkAcrossPauseMS, sz.ForkPauseMS = med(func(r StallRound) float64 { return r.ForkAcrossPauseMS }), med(func(r StallRound) float64 { return r.ForkPauseMS })
	sz.CloneMS = med(func(r StallRound) float64 { return r.CloneMS })
	var save, restore, agent, sr, wc, file []float64
	for _, s := range sz.Libvirt {
		if s.ReadyMS == 0 {
			continue // a round that failed
		}
		save, restore, agent = append(save, s.Phases.SaveMS), append(restore, s.Phases.RestoreMS), append(agent, s.Phases.AgentMS)
		sr, wc = append(sr, s.Phases.SaveMS+s.ReadyMS), append(wc, s.WallMS)
		file = append(file, float64(s.SaveFileBytes))
	}
	sz.SaveMS, sz.RestoreMS, sz.AgentMS = Median(save), Median(restore), Median(agent)
	sz.SaveRestoreMS, sz.WithCopyMS, sz.SaveFileBytes = Median(sr), Median(wc), int64(Median(file))
	sz.Ratios = stallRatios(*sz)
}

// stallRatios are issue 11's two targets and the figures that explain them.
func stallRatios(sz StallSize) []Ratio {
	var out []Ratio
	add := func(r Ratio) {
		if r.Value != 0 {
			out = append(out, r)
		}
	}
	add(atMost("client stall: fork ÷ floor (longest gap between replies, same client)", Factor(sz.ForkMaxGapMS, sz.FloorMaxGapMS), 1.5))
	add(info("client stall: fork's longest gap ÷ floor's pause (stop, device state, cont)", Factor(sz.ForkMaxGapMS, sz.FloorPauseMS)))
	add(info("client gap across the fork's pause ÷ floor's longest gap", Factor(sz.ForkAcrossPauseMS, sz.FloorMaxGapMS)))
	add(info("client p99 gap: fork ÷ floor", Factor(sz.ForkP99GapMS, sz.FloorP99GapMS)))
	add(info("client stall: fork ÷ quiet window (the client's noise)", Factor(sz.ForkMaxGapMS, sz.QuietMaxGapMS)))
	add(atLeast("whole clone: virsh save + restore (to agent) ÷ vmfork fork (to first child READY)", Factor(sz.SaveRestoreMS, sz.CloneMS), 10))
	add(info("whole clone: virsh save + copy + restore ÷ vmfork fork", Factor(sz.WithCopyMS, sz.CloneMS)))
	return out
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
