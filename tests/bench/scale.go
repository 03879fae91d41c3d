package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmfork/vmfork"
)

// ScaleOptions choose the two sweeps: guest RAM with one child per call,
// and children per call at one RAM size.
type ScaleOptions struct {
	MemoryMiB      []int // default 256, 512, 1024, 2048, 4096
	Children       []int // default 1, 2, 4, 8, 16, 32
	ChildMemoryMiB int   // guest RAM of the children sweep; default 256
	Parallel       int   // default 4
	Rounds         int   // forks per point; default 3
}

// ScalePoint is one point of a sweep: medians over its rounds.
type ScalePoint struct {
	MemoryMiB int     `json:"memory_mib"`
	Children  int     `json:"children"`
	Rounds    int     `json:"rounds"`
	PauseMS   float64 `json:"source_pause_ms"`
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
	e.begin(len(opt.MemoryMiB)*(1+opt.Rounds) + 1 + len(opt.Children)*opt.Rounds)
	for _, mem := range opt.MemoryMiB {
		p, err := e.scalePoint(ctx, fmt.Sprintf("ram%d", mem), mem, []int{1}, opt)
		res.Host = e.host
		res.ByMemory = append(res.ByMemory, p...)
		if err != nil {
			return res, fmt.Errorf("scale: %d MiB: %w", mem, err)
		}
	}
	p, err := e.scalePoint(ctx, "kids", opt.ChildMemoryMiB, opt.Children, opt)
	res.ByChildren = p
	res.Growth = growth(res)
	if err != nil {
		return res, fmt.Errorf("scale: children per call: %w", err)
	}
	return res, nil
}

// scalePoint boots one source of mem MiB and, for each child count, forks
// that many children opt.Rounds times, removing them after each call.
func (e *Env) scalePoint(ctx context.Context, src string, mem int, counts []int, opt ScaleOptions) (pts []ScalePoint, err error) {
	e.announce("scale: booting a %s source", memLabel(mem))
	_, bootD, err := e.boot(ctx, src, mem)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, e.remove(context.WithoutCancel(ctx), src)) }()
	e.step("scale: %s source booted", memLabel(mem))
	for _, n := range counts {
		var pause, run, ready, last, wall, tplRAM []float64
		for r := range opt.Rounds {
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
			MemoryMiB: mem, Children: n, Rounds: opt.Rounds,
			PauseMS: Median(pause), RunningMS: Median(run), ReadyMS: Median(ready), LastMS: Median(last),
			WallMS: Median(wall), TemplateRAMBytes: int64(Median(tplRAM)), SourceBootMS: ms(bootD),
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
