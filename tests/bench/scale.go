package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/profile"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/sharedmem"
)

// ScaleOptions choose the two sweeps: guest RAM with one child per call,
// and children per call at one RAM size.
type ScaleOptions struct {
	MemoryMiB      []int // default 256, 512, 1024, 2048, 4096
	Children       []int // default 1, 2, 4, 8, 16, 32
	ChildMemoryMiB int   // guest RAM of the children sweep; default 256
	Parallel       int   // default 4
	Rounds         int   // forks per point; default 3
	// GuestUse fills each source of the RAM sweep with non-zero data before
	// its rounds: one value for every size, or one per MemoryMiB entry. The
	// pause must not grow with what the guest uses (docs/FLATPAUSE.md).
	GuestUse []GuestUse
	// Depth, when positive, adds the depth sweep: a source of
	// ChildMemoryMiB filled by DepthUse is forked, then its child, then
	// that child's child, down to Depth levels, Rounds forks per level.
	Depth    int
	DepthUse GuestUse
	// NoChildrenSweep skips the children-per-call sweep.
	NoChildrenSweep bool
	// Loop, when positive, adds an agent's loop: a source of ChildMemoryMiB
	// filled by DepthUse is forked Loop times, each child removed before
	// the next fork and 2 MiB written in the source between forks.
	Loop int
}

// LoopResult is the agent's loop: the source's pause and memory after its
// first and its last fork.
type LoopResult struct {
	Forks         int     `json:"forks"`
	WrittenBytes  int64   `json:"guest_written_bytes"` // by the source between the first and the last fork
	FirstPauseMS  float64 `json:"first_pause_ms"`
	LastPauseMS   float64 `json:"last_pause_ms"`
	MedianPauseMS float64 `json:"median_pause_ms"`
	// FirstQuarterMS and LastQuarterMS are the median pauses of the first
	// and the last quarter of the forks: one fork's pause on a shared host
	// is too noisy to compare.
	FirstQuarterMS   float64   `json:"first_quarter_pause_ms"`
	LastQuarterMS    float64   `json:"last_quarter_pause_ms"`
	PausesMS         []float64 `json:"pauses_ms"`
	FirstPSSBytes    int64     `json:"source_pss_after_first_bytes"`
	LastPSSBytes     int64     `json:"source_pss_after_last_bytes"`
	MemDirAfterFirst int64     `json:"mem_dir_after_first_bytes"`
	MemDirAfterLast  int64     `json:"mem_dir_after_last_bytes"`
}

// useFor is the fill of the i-th source of the RAM sweep.
func (opt ScaleOptions) useFor(i, mem int) (int, error) {
	switch {
	case len(opt.GuestUse) == 0:
		return 0, nil
	case len(opt.GuestUse) == 1:
		return opt.GuestUse[0].MiBFor(mem)
	case i < len(opt.GuestUse):
		return opt.GuestUse[i].MiBFor(mem)
	}
	return 0, fmt.Errorf("%d guest-use values for %d RAM sizes: %w", len(opt.GuestUse), len(opt.MemoryMiB), vmfork.ErrInvalid)
}

// ScalePoint is one point of a sweep: medians over its rounds.
type ScalePoint struct {
	MemoryMiB int     `json:"memory_mib"`
	UsedMiB   int     `json:"guest_used_mib"`  // non-zero data written into the source
	Depth     int     `json:"depth,omitempty"` // depth sweep: 1 forks the booted source
	Children  int     `json:"children"`
	Rounds    int     `json:"rounds"`
	PauseMS   float64 `json:"source_pause_ms"`
	// PauseFloorMS is the same source paused for stop, its device-state
	// save and cont with nothing else, in the same rounds: what no freeze
	// can go below.
	PauseFloorMS float64 `json:"source_pause_floor_ms,omitempty"`
	// RAMCopyMS is how long copying the source's RAM file (its allocated
	// extents) took, timed once before the rounds: what a freeze that
	// copies RAM in the pause (vmfork before the flat pause) adds to the
	// floor.
	RAMCopyMS float64 `json:"ram_copy_ms,omitempty"`
	RunningMS float64 `json:"child_running_ms"` // median child of the call
	ReadyMS   float64 `json:"child_ready_ms"`   // median child of the call
	LastMS    float64 `json:"last_child_ready_ms"`
	// WallMS is the whole fork call: pause plus every child ready.
	WallMS float64 `json:"wall_ms"`
	// TemplateRAMBytes is what the freeze copied: the allocated part of the
	// source's RAM file.
	TemplateRAMBytes int64   `json:"template_ram_allocated_bytes"`
	SourceBootMS     float64 `json:"source_boot_ms,omitempty"`
}

// ScaleResult is `vmfork bench scale`.
type ScaleResult struct {
	Host           Host         `json:"host"`
	Rounds         int          `json:"rounds"`
	Parallel       int          `json:"parallel"`
	ChildMemoryMiB int          `json:"children_sweep_memory_mib"`
	ByMemory       []ScalePoint `json:"by_memory"`
	ByChildren     []ScalePoint `json:"by_children"`
	ByDepth        []ScalePoint `json:"by_depth,omitempty"`
	Loop           *LoopResult  `json:"loop,omitempty"`
	// Growth holds exponents k in time ∝ size^k between the first and the
	// last point of a sweep: 1 grows as fast as guest RAM, 0 not at all.
	Growth []Ratio `json:"growth"`
}

// Scale runs both sweeps. A partial result comes back with an error.
func Scale(ctx context.Context, e *Env, opt ScaleOptions) (*ScaleResult, error) {
	if len(opt.MemoryMiB) == 0 {
		opt.MemoryMiB = []int{256, 512, 1024, 2048, 4096}
	}
	if len(opt.Children) == 0 {
		opt.Children = []int{1, 2, 4, 8, 16, 32}
	}
	if opt.ChildMemoryMiB <= 0 {
		opt.ChildMemoryMiB = 256
	}
	if opt.Parallel <= 0 {
		opt.Parallel = 4
	}
	if opt.Rounds <= 0 {
		opt.Rounds = 3
	}
	res := &ScaleResult{Rounds: opt.Rounds, Parallel: opt.Parallel, ChildMemoryMiB: opt.ChildMemoryMiB}
	kids := len(opt.Children)
	if opt.NoChildrenSweep {
		kids = 0
	}
	e.begin(len(opt.MemoryMiB)*(1+opt.Rounds) + min(kids, 1) + kids*opt.Rounds + opt.Depth*opt.Rounds)
	for i, mem := range opt.MemoryMiB {
		used, err := opt.useFor(i, mem)
		if err != nil {
			return res, fmt.Errorf("scale: %w", err)
		}
		p, err := e.scalePoint(ctx, fmt.Sprintf("ram%d", mem), mem, used, []int{1}, opt)
		res.Host = e.host
		res.ByMemory = append(res.ByMemory, p...)
		if err != nil {
			return res, fmt.Errorf("scale: %d MiB: %w", mem, err)
		}
	}
	if kids > 0 {
		p, err := e.scalePoint(ctx, "kids", opt.ChildMemoryMiB, 0, opt.Children, opt)
		res.ByChildren = p
		if err != nil {
			res.Growth = growth(res)
			return res, fmt.Errorf("scale: children per call: %w", err)
		}
	}
	if opt.Depth > 0 {
		p, err := e.scaleDepth(ctx, opt)
		res.ByDepth = p
		if err != nil {
			res.Growth = growth(res)
			return res, fmt.Errorf("scale: depth: %w", err)
		}
	}
	if opt.Loop > 0 {
		l, err := e.scaleLoop(ctx, opt)
		res.Loop = l
		if err != nil {
			res.Growth = growth(res)
			return res, fmt.Errorf("scale: loop: %w", err)
		}
	}
	res.Growth = growth(res)
	return res, nil
}

// scaleLoop runs the agent's loop (ScaleOptions.Loop).
func (e *Env) scaleLoop(ctx context.Context, opt ScaleOptions) (l *LoopResult, err error) {
	mem := opt.ChildMemoryMiB
	used, err := opt.DepthUse.MiBFor(mem)
	if err != nil {
		return nil, err
	}
	e.announce("scale: booting a %s source for the loop", memLabel(mem))
	src := "loop"
	m, _, err := e.boot(ctx, src, mem)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, e.remove(context.WithoutCancel(ctx), src)) }()
	if err := e.fillSource(ctx, src, used); err != nil {
		return nil, err
	}
	l = &LoopResult{Forks: opt.Loop}
	var pauses []float64
	const step = 2 << 20
	for i := 1; i <= opt.Loop; i++ {
		child := fmt.Sprintf("loop-%d", i)
		fr, err := e.mgr.Fork(ctx, vmfork.ForkRequest{Source: src, Names: []string{child}})
		if err != nil {
			if fr != nil && len(fr.Children) > 0 {
				err = errors.Join(err, e.remove(context.WithoutCancel(ctx), child))
			}
			return l, err
		}
		pauses = append(pauses, fr.PauseMS)
		if err := e.remove(context.WithoutCancel(ctx), child); err != nil {
			return l, err
		}
		r, err := sharedmem.ReadRollup(m.PID)
		if err != nil {
			return l, err
		}
		switch i {
		case 1:
			l.FirstPauseMS, l.FirstPSSBytes, l.MemDirAfterFirst = fr.PauseMS, r.PSS, dirAllocated(filepath.Dir(m.Paths.RAM))
		case opt.Loop:
			l.LastPauseMS, l.LastPSSBytes, l.MemDirAfterLast = fr.PauseMS, r.PSS, dirAllocated(filepath.Dir(m.Paths.RAM))
		}
		e.step("scale: loop fork %d: pause %.0f ms", i, fr.PauseMS)
		if i < opt.Loop {
			if _, err := e.mgr.Exec(ctx, src, vmfork.ExecRequest{Argv: []string{"/bin/sh", "-c",
				fmt.Sprintf("head -c %d /dev/urandom > /run/loop-%d", step, i)}}); err != nil {
				return l, fmt.Errorf("write in %s: %w", src, err)
			}
			l.WrittenBytes += step
		}
	}
	l.MedianPauseMS, l.PausesMS = Median(pauses), pauses
	q := max(len(pauses)/4, 1)
	l.FirstQuarterMS, l.LastQuarterMS = Median(pauses[:q]), Median(pauses[len(pauses)-q:])
	return l, nil
}

// dirAllocated is what the files of dir hold on the (tmpfs) disk.
func dirAllocated(dir string) int64 {
	ents, _ := os.ReadDir(dir)
	var n int64
	for _, e := range ents {
		n += allocated(filepath.Join(dir, e.Name()))
	}
	return n
}

// pauseFloor pauses machine name for stop, a device-state save into a
// scratch file, and cont, and returns how long it was paused: the floor of
// any freeze of it. The save is the one a fork of it makes: the device
// sections alone (qemustate.SaveDevices) where the guest has no RAM block outside
// its memory file, else a migration stream with x-ignore-shared.
func (e *Env) pauseFloor(ctx context.Context, name string) (float64, error) {
	m, err := e.mgr.Store.LoadMachine(name)
	if err != nil {
		return 0, err
	}
	mon, err := qmp.Dial(ctx, m.Paths.QMP)
	if err != nil {
		return 0, fmt.Errorf("pause floor of %s: %w", name, err)
	}
	defer mon.Close()
	if err := qemustate.PrepareSave(ctx, mon); err != nil {
		return 0, fmt.Errorf("pause floor of %s: %w", name, err)
	}
	scratch := filepath.Join(m.Paths.Dir, "floor.devstate")
	defer os.Remove(scratch)
	shared, err := sharedmem.QOMShare(ctx, mon, profile.RAMBlock)
	if err != nil {
		return 0, fmt.Errorf("pause floor of %s: %w", name, err)
	}
	save, err := qemustate.PrepareDeviceState(ctx, mon, scratch, "floor", profile.RAMBlock, shared, 2*time.Millisecond, nil)
	if err != nil {
		return 0, fmt.Errorf("pause floor of %s: %w", name, err)
	}
	defer save.Release()
	start := time.Now()
	if err := mon.Stop(ctx); err != nil {
		return 0, fmt.Errorf("pause floor of %s: %w", name, err)
	}
	serr := save.Save(ctx)
	if err := mon.Cont(context.WithoutCancel(ctx)); err != nil {
		return 0, fmt.Errorf("pause floor of %s: resume: %w (it may still be paused)", name, err)
	}
	d := time.Since(start)
	if serr != nil {
		return 0, fmt.Errorf("pause floor of %s: %w", name, serr)
	}
	return ms(d), nil
}

// ramCopy times a copy of booted machine name's RAM file, as the freeze
// before the flat pause made in the pause, and removes the copy.
func (e *Env) ramCopy(name string) (float64, error) {
	m, err := e.mgr.Store.LoadMachine(name)
	if err != nil {
		return 0, err
	}
	dst := filepath.Join(filepath.Dir(m.Paths.RAM), "."+name+".copy-timing")
	start := time.Now()
	_, err = sharedmem.Freeze(context.Background(), m.Paths.RAM, dst)
	d := time.Since(start)
	os.Remove(dst)
	if err != nil {
		return 0, fmt.Errorf("time a RAM copy of %s: %w", name, err)
	}
	return ms(d), nil
}

// fillSource fills machine name with used MiB of non-zero data.
func (e *Env) fillSource(ctx context.Context, name string, used int) error {
	if used <= 0 {
		return nil
	}
	e.announce("scale: filling %s with %s of non-zero data", name, memLabel(used))
	_, err := fillGuest(ctx, managerRunner(e.mgr, name), MethodVmfork, name, used)
	return err
}

// scaleDepth forks a chain: the booted source, then the child made by the
// previous level's last round, opt.Depth levels deep. Each level's machine
// writes a little memory before it is forked, as an agent's step would.
func (e *Env) scaleDepth(ctx context.Context, opt ScaleOptions) (pts []ScalePoint, err error) {
	mem := opt.ChildMemoryMiB
	used, err := opt.DepthUse.MiBFor(mem)
	if err != nil {
		return nil, err
	}
	e.announce("scale: booting a %s source for the depth sweep", memLabel(mem))
	cur := "depth0"
	if _, _, err := e.boot(ctx, cur, mem); err != nil {
		return nil, err
	}
	chain := []string{cur}
	defer func() {
		for i := len(chain) - 1; i >= 0; i-- {
			err = errors.Join(err, e.remove(context.WithoutCancel(ctx), chain[i]))
		}
	}()
	if err := e.fillSource(ctx, cur, used); err != nil {
		return nil, err
	}
	for d := 1; d <= opt.Depth; d++ {
		var pause, run, ready, floor []float64
		next := ""
		for r := range opt.Rounds {
			f, err := e.pauseFloor(ctx, cur)
			if err != nil {
				return pts, err
			}
			floor = append(floor, f)
			name := fmt.Sprintf("depth%d-%d", d, r+1)
			e.announce("scale: depth %d, round %d/%d", d, r+1, opt.Rounds)
			fr, ferr := e.mgr.Fork(ctx, vmfork.ForkRequest{Source: cur, Names: []string{name}})
			if ferr != nil {
				if fr != nil && len(fr.Children) > 0 {
					err = e.remove(context.WithoutCancel(ctx), name)
				}
				return pts, errors.Join(ferr, err)
			}
			pause = append(pause, fr.PauseMS)
			run, ready = append(run, fr.Children[0].RunningMS), append(ready, fr.Children[0].ReadyMS)
			if r == opt.Rounds-1 {
				next = name
				chain = append(chain, name)
			} else if err := e.remove(context.WithoutCancel(ctx), name); err != nil {
				return pts, err
			}
			e.step("scale: depth %d round %d: pause %.0f ms", d, r+1, fr.PauseMS)
		}
		pts = append(pts, ScalePoint{MemoryMiB: mem, UsedMiB: used, Depth: d, Children: 1, Rounds: opt.Rounds,
			PauseMS: Median(pause), RunningMS: Median(run), ReadyMS: Median(ready), LastMS: Median(ready), PauseFloorMS: Median(floor)})
		cur = next
		if _, err := e.mgr.Exec(ctx, cur, vmfork.ExecRequest{Argv: []string{"/bin/sh", "-c",
			"head -c 4194304 /dev/urandom > /run/depth-step"}}); err != nil {
			return pts, fmt.Errorf("write in %s: %w", cur, err)
		}
	}
	return pts, nil
}

// scalePoint boots one source of mem MiB and, for each child count, forks
// that many children opt.Rounds times, removing them after each call.
func (e *Env) scalePoint(ctx context.Context, src string, mem, used int, counts []int, opt ScaleOptions) (pts []ScalePoint, err error) {
	e.announce("scale: booting a %s source", memLabel(mem))
	_, bootD, err := e.boot(ctx, src, mem)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, e.remove(context.WithoutCancel(ctx), src)) }()
	if err := e.fillSource(ctx, src, used); err != nil {
		return nil, err
	}
	copyMS, err := e.ramCopy(src)
	if err != nil {
		return nil, err
	}
	e.step("scale: %s source booted", memLabel(mem))
	for _, n := range counts {
		var pause, run, ready, last, wall, tplRAM, floor []float64
		for r := range opt.Rounds {
			f, err := e.pauseFloor(ctx, src)
			if err != nil {
				return pts, err
			}
			floor = append(floor, f)
			e.announce("scale: %s, %d children per call, round %d/%d", memLabel(mem), n, r+1, opt.Rounds)
			start := time.Now()
			fr, ferr := e.mgr.Fork(ctx, vmfork.ForkRequest{Source: src, Count: n, Parallel: opt.Parallel, MaxChildren: max(n, vmfork.DefaultMaxChildren)})
			w := time.Since(start)
			if fr != nil {
				tplRAM = append(tplRAM, float64(allocated(e.mgr.Store.TemplatePaths(fr.Template).RAM)))
				var cr, cy []float64
				for _, c := range fr.Children {
					cr, cy = append(cr, c.RunningMS), append(cy, c.ReadyMS)
					err = errors.Join(err, e.remove(context.WithoutCancel(ctx), c.Name))
				}
				if ferr == nil {
					pause, wall = append(pause, fr.PauseMS), append(wall, ms(w))
					run, ready, last = append(run, Median(cr)), append(ready, Median(cy)), append(last, spreadOf(cy).Max)
				}
			}
			if err = errors.Join(ferr, err); err != nil {
				return pts, err
			}
			e.step("scale: %s x%d round %d: pause %.0f ms", memLabel(mem), n, r+1, fr.PauseMS)
		}
		pts = append(pts, ScalePoint{
			MemoryMiB: mem, UsedMiB: used, Children: n, Rounds: opt.Rounds,
			PauseMS: Median(pause), RunningMS: Median(run), ReadyMS: Median(ready), LastMS: Median(last),
			WallMS: Median(wall), TemplateRAMBytes: int64(Median(tplRAM)), SourceBootMS: ms(bootD), PauseFloorMS: Median(floor), RAMCopyMS: copyMS,
		})
	}
	return pts, nil
}

// growth compares the first and last point of each sweep. "Clearly slower
// than guest RAM" is taken as an exponent of at most 0.5: sixteen times the
// RAM costs at most four times the time.
func growth(res *ScaleResult) []Ratio {
	var out []Ratio
	if n := len(res.ByMemory); n >= 2 {
		a, b := res.ByMemory[0], res.ByMemory[n-1]
		x1, x2 := float64(a.MemoryMiB), float64(b.MemoryMiB)
		out = append(out,
			atMost("source pause vs guest RAM (exponent)", GrowthExponent(x1, a.PauseMS, x2, b.PauseMS), 0.5),
			atMost("child ready vs guest RAM (exponent)", GrowthExponent(x1, a.ReadyMS, x2, b.ReadyMS), 0.5),
			info("frozen RAM vs guest RAM (exponent)", GrowthExponent(x1, float64(a.TemplateRAMBytes), x2, float64(b.TemplateRAMBytes))))
	}
	if n := len(res.ByMemory); n >= 2 && (res.ByMemory[0].UsedMiB > 0 || res.ByMemory[n-1].UsedMiB > 0) {
		a, b := res.ByMemory[0], res.ByMemory[n-1]
		out = append(out,
			atMost(fmt.Sprintf("source pause, %s using %s ÷ %s using %s", memLabel(b.MemoryMiB), usedLabel(b.UsedMiB),
				memLabel(a.MemoryMiB), usedLabel(a.UsedMiB)), b.PauseMS/a.PauseMS, 1.2),
			atMost(fmt.Sprintf("child running, %s ÷ %s", memLabel(b.MemoryMiB), memLabel(a.MemoryMiB)), b.RunningMS/a.RunningMS, 1.25))
	}
	for _, p := range append(append([]ScalePoint{}, res.ByMemory...), res.ByDepth...) {
		if p.PauseFloorMS <= 0 {
			continue
		}
		label := fmt.Sprintf("%s using %s", memLabel(p.MemoryMiB), usedLabel(p.UsedMiB))
		if p.Depth > 0 {
			label = fmt.Sprintf("depth %d", p.Depth)
		}
		out = append(out, atMost("source pause ÷ floor (stop, device state, cont), "+label, p.PauseMS/p.PauseFloorMS, 1.5))
		if p.RAMCopyMS > 0 {
			out = append(out, info("pause of a freeze copying RAM (floor + copy) ÷ source pause, "+label, (p.PauseFloorMS+p.RAMCopyMS)/p.PauseMS))
		}
	}
	if n := len(res.ByDepth); n >= 2 {
		a, b := res.ByDepth[0], res.ByDepth[n-1]
		out = append(out,
			atMost(fmt.Sprintf("source pause, depth %d ÷ depth 1", b.Depth), b.PauseMS/a.PauseMS, 1.2),
			atMost(fmt.Sprintf("child running, depth %d ÷ depth 1", b.Depth), b.RunningMS/a.RunningMS, 1.2))
	}
	if l := res.Loop; l != nil && l.FirstPauseMS > 0 {
		out = append(out,
			atMost("loop: median pause of the last quarter of forks ÷ the first quarter", l.LastQuarterMS/l.FirstQuarterMS, 1.2),
			atMost(fmt.Sprintf("loop: source PSS after fork %d ÷ (after fork 1 + what it wrote)", l.Forks),
				float64(l.LastPSSBytes)/float64(l.FirstPSSBytes+l.WrittenBytes), 1.1),
			info("loop: mem dir after the last fork ÷ after the first", float64(l.MemDirAfterLast)/float64(max(l.MemDirAfterFirst, 1))))
	}
	if n := len(res.ByChildren); n >= 2 {
		a, b := res.ByChildren[0], res.ByChildren[n-1]
		x1, x2 := float64(a.Children), float64(b.Children)
		out = append(out,
			info("source pause vs children per call (exponent)", GrowthExponent(x1, a.PauseMS, x2, b.PauseMS)),
			info("median child ready vs children per call (exponent)", GrowthExponent(x1, a.ReadyMS, x2, b.ReadyMS)),
			info("whole call vs children per call (exponent)", GrowthExponent(x1, a.WallMS, x2, b.WallMS)))
	}
	return out
}

// usedLabel is a fill for tables: "-" for none.
func usedLabel(mib int) string {
	if mib <= 0 {
		return "-"
	}
	return memLabel(mib)
}
