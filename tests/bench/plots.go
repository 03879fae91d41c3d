package bench

import (
	"fmt"
	"io"
	"slices"
)

// Colours: one per phase in the time bars, one per kind of memory in the
// memory bars, the same in every plot.
const (
	colRunning  = "#1971c2"
	colAgent    = "#74c0fc"
	colIdentity = "#9c36b5"
	colBoot     = "#adb5bd"
	colVmfork   = "#2f9e44"
	colOther    = "#868e96"
	colLibvirt  = "#e8590c"
	colBudget   = "#c92a2a"
	colGuestRAM = "#e8590c"
	colTCG      = "#fab005"
	colFiles    = "#ced4da"
)

// Figure draws the peers comparison: per RAM size, time to ready split at
// "running", and memory per child.
func (r *PeersResult) Figure() Figure {
	f := Figure{
		Title:   "vmfork vs. its peers: one running copy of a running guest",
		Notes:   []string{"host: " + r.Host.Short(), fmt.Sprintf("medians of %d rounds; methods alternate order each round; PSS read %s after the child answered", r.Rounds, fmtMS(r.SettleMS))},
		Columns: 2,
	}
	for _, sz := range r.Sizes {
		var times, mem []Bar
		for _, s := range sz.Summary {
			// max: a paused start (virsh create --paused) has no agent time.
			segs := []Segment{{Name: "until running", Value: s.RunningMS, Color: colRunning},
				{Name: "until the agent answers", Value: max(s.AgentMS-s.RunningMS, 0), Color: colAgent},
				{Name: "identity chain", Value: max(s.ReadyMS-s.AgentMS, 0), Color: colIdentity}}
			if s.RunningMS == 0 {
				segs = []Segment{{Name: "boot until the agent answers", Value: s.ReadyMS, Color: colBoot}}
			}
			times = append(times, Bar{Label: s.Label, Segments: segs, Text: fmtMS(max(s.ReadyMS, s.RunningMS))})
			if s.PSSBytes == 0 {
				continue // not a running child: nothing to weigh
			}
			m := s.Memory
			mem = append(mem, Bar{Label: s.Label, Text: fmtBytes(s.PSSBytes), Segments: []Segment{
				{Name: "guest RAM", Value: mib(m.GuestRAMBytes), Color: colGuestRAM},
				{Name: "TCG code", Value: mib(m.TCGBytes), Color: colTCG},
				{Name: "QEMU anon", Value: mib(m.AnonBytes), Color: colOther},
				{Name: "files", Value: mib(m.FileBytes), Color: colFiles},
			}})
		}
		guest := memLabel(sz.MemoryMiB) + " guest"
		if sz.GuestUseMiB > 0 {
			guest += fmt.Sprintf(" using %d MiB", sz.GuestUseMiB)
		}
		f.Panels = append(f.Panels,
			BarPanel{Title: guest + ": child time to ready", Unit: "ms", Bars: times, Clip: true},
			BarPanel{Title: guest + ": memory per child (PSS)", Unit: "MiB", Bars: mem})
		for _, ra := range sz.Ratios {
			if ra.Met != nil {
				f.Notes = append(f.Notes, fmt.Sprintf("%s: %s %s %s", memLabel(sz.MemoryMiB), ra.Name, fmtRatio(ra), verdict(ra)))
			}
		}
	}
	return f
}

func verdict(r Ratio) string {
	if r.Met == nil {
		return ""
	}
	if *r.Met {
		return "(target " + r.Target + ": met)"
	}
	return "(target " + r.Target + ": missed)"
}

// Figure draws the burst: cumulative running and ready children over
// time, the host's CPU by whom over the same time, and memory.
func (r *BurstResult) Figure() Figure {
	curve := []Point{{0, 0}}
	for i, t := range r.ReadyAtMS {
		curve = append(curve, Point{t / 1000, float64(i + 1)})
	}
	var runAt []float64
	for _, c := range r.Children {
		if c.RunningMS > 0 {
			runAt = append(runAt, c.RunningMS)
		}
	}
	slices.Sort(runAt)
	running := []Point{{0, 0}}
	for i, t := range runAt {
		running = append(running, Point{t / 1000, float64(i + 1)})
	}
	budget := 0.25 * float64(r.GuestRAMBytes) / (1 << 30)
	mem := []Bar{{Label: fmt.Sprintf("total PSS, %d children", r.Count), Segments: []Segment{{Value: float64(r.TotalPSSBytes) / (1 << 30), Color: colVmfork}}}}
	// The host is shared: MemAvailable can even rise when others free memory.
	if drop := r.MemAvailBefore - r.MemAvailAfter; drop > 0 {
		mem = append(mem, Bar{Label: "host MemAvailable drop", Segments: []Segment{{Value: float64(drop) / (1 << 30), Color: colOther}}})
	}
	mem = append(mem, Bar{Label: fmt.Sprintf("%d x guest RAM", r.Count), Segments: []Segment{{Value: float64(r.GuestRAMBytes) / (1 << 30), Color: colBoot}}})
	f := Figure{
		Title: fmt.Sprintf("Morning burst: %d children of a %s guest in one fork call (%d at a time)", r.Count, memLabel(r.MemoryMiB), r.Parallel),
		Notes: []string{
			"host: " + r.Host.Short(),
			fmt.Sprintf("source paused %s; %d of %d READY after %s (%d failed): %.2f children/s; total PSS %s = %.1f%% of %d x guest RAM",
				fmtMS(r.PauseMS), r.Ready, r.Count, fmtMS(r.WallMS), len(r.Failed), r.ChildrenPerSecond, fmtBytes(r.TotalPSSBytes), 100*r.PSSShare, r.Count),
		},
		Columns: 1,
		Panels: []Panel{
			LinePanel{Title: "children running and READY", XLabel: "seconds since the fork call", YLabel: "children",
				Series: []Series{
					{Name: "running (vCPUs let run, cumulative)", Color: colRunning, Step: true, Dashed: true, Points: running},
					{Name: "READY (identity chain done, cumulative)", Color: colVmfork, Step: true, Points: curve},
				}, Height: 340},
		},
	}
	if c := r.CPU; c != nil && len(c.Samples) > 0 {
		f.Notes = append(f.Notes, cpuNote(c))
		f.Panels = append(f.Panels, cpuPanel(c), cpuBars(c))
	}
	f.Panels = append(f.Panels, BarPanel{Title: "memory of the whole burst", Unit: "GiB", Marks: []Mark{{Value: budget, Label: "target: 25% of N x guest RAM", Color: colBudget}},
		Bars: mem})
	return f
}

// CPU colours: the idle children's share is the TCG tax, in red.
const (
	colIdleKids  = "#c92a2a"
	colChainKids = "#2f9e44"
	colOurs      = "#1971c2"
	colElse      = "#868e96"
	colFree      = "#e9ecef"
)

func cpuNote(c *BurstCPU) string {
	cs := c.CoreSeconds
	all := cs.busy() + cs.HostIdle
	if all <= 0 {
		return ""
	}
	pct := func(v float64) float64 { return 100 * v / all }
	return fmt.Sprintf("CPU of the call (%d CPUs): idle READY children %.0f%%, children starting %.0f%%, vmfork + source %.0f%%, other processes %.0f%%, free %.0f%%; an idle child costs %.1f%% of a core",
		c.CPUs, pct(cs.IdleChildren), pct(cs.ChainChildren), pct(cs.Vmfork+cs.Source), pct(cs.Other), pct(cs.HostIdle), 100*c.IdleChildCores)
}

// cpuPanel draws each share of the host's CPU over the call.
func cpuPanel(c *BurstCPU) LinePanel {
	var idle, chain, ours, other []Point
	for _, s := range c.Samples {
		x := s.AtMS / 1000
		idle, chain = append(idle, Point{x, s.IdleChildren}), append(chain, Point{x, s.ChainChildren})
		ours, other = append(ours, Point{x, s.Vmfork + s.Source}), append(other, Point{x, s.Other})
	}
	last := c.Samples[len(c.Samples)-1].AtMS / 1000
	capacity := []Point{{0, float64(c.CPUs)}, {last, float64(c.CPUs)}}
	return LinePanel{Title: "where the host's CPU went (sampled each second)", XLabel: "seconds since the fork call", YLabel: "CPUs busy",
		Series: []Series{
			{Name: "READY children, idle (TCG)", Color: colIdleKids, Points: idle},
			{Name: "children starting (QEMU + identity chain)", Color: colChainKids, Points: chain},
			{Name: "vmfork + source", Color: colOurs, Points: ours},
			{Name: "other processes, kernel", Color: colElse, Points: other},
			{Name: "host CPUs", Color: colBudget, Dashed: true, Points: capacity},
		}, Height: 300}
}

// cpuBars sums the call's CPU by whom, in core-seconds.
func cpuBars(c *BurstCPU) BarPanel {
	cs := c.CoreSeconds
	return BarPanel{Title: "the call's CPU time by whom", Unit: "CPU s", Bars: []Bar{{
		Label: fmt.Sprintf("%d CPUs x the call", c.CPUs),
		Segments: []Segment{
			{Name: "READY children, idle", Value: cs.IdleChildren, Color: colIdleKids},
			{Name: "children starting", Value: cs.ChainChildren, Color: colChainKids},
			{Name: "vmfork + source", Value: cs.Vmfork + cs.Source, Color: colOurs},
			{Name: "other processes, kernel", Value: cs.Other, Color: colElse},
			{Name: "free", Value: cs.HostIdle, Color: colFree},
		},
	}}}
}

// Figure draws both sweeps as lines, with a line proportional to guest RAM
// for scale.
func (r *ScaleResult) Figure() Figure {
	f := Figure{Title: "How the cost of a fork grows", Notes: []string{"host: " + r.Host.Short()}, Columns: 2}
	for _, g := range r.Growth {
		f.Notes = append(f.Notes, fmt.Sprintf("%s: %s %s", g.Name, fmtFactor(g.Value), verdict(g)))
	}
	if len(r.ByMemory) > 0 {
		var pause, run, ready, prop []Point
		var ticks []Tick
		for _, p := range r.ByMemory {
			x := float64(p.MemoryMiB)
			pause, run, ready = append(pause, Point{x, p.PauseMS}), append(run, Point{x, p.RunningMS}), append(ready, Point{x, p.ReadyMS})
			prop = append(prop, Point{x, r.ByMemory[0].PauseMS * x / float64(r.ByMemory[0].MemoryMiB)})
			ticks = append(ticks, Tick{x, memLabel(p.MemoryMiB)})
		}
		f.Panels = append(f.Panels, LinePanel{
			Title: "by guest RAM (one child per call)", XLabel: "guest RAM (log scale)", YLabel: "ms", LogX: true, XTicks: ticks,
			Series: []Series{
				{Name: "source pause", Color: colLibvirt, Dots: true, Points: pause},
				{Name: "child running", Color: colRunning, Dots: true, Points: run},
				{Name: "child ready", Color: colVmfork, Dots: true, Points: ready},
				{Name: "pause if it grew with RAM", Color: colOther, Dashed: true, Points: prop},
			},
		})
	}
	if len(r.ByChildren) > 0 {
		var pause, ready, wall []Point
		var ticks []Tick
		for _, p := range r.ByChildren {
			x := float64(p.Children)
			pause, ready, wall = append(pause, Point{x, p.PauseMS}), append(ready, Point{x, p.ReadyMS}), append(wall, Point{x, p.WallMS / float64(p.Children)})
			ticks = append(ticks, Tick{x, fmt.Sprint(p.Children)})
		}
		f.Panels = append(f.Panels, LinePanel{
			Title:  fmt.Sprintf("by children per call (%s guest, %d at a time)", memLabel(r.ChildMemoryMiB), r.Parallel),
			XLabel: "children per fork call (log scale)", YLabel: "ms", LogX: true, XTicks: ticks,
			Series: []Series{
				{Name: "source pause", Color: colLibvirt, Dots: true, Points: pause},
				{Name: "median child ready", Color: colVmfork, Dots: true, Points: ready},
				{Name: "whole call / children", Color: colRunning, Dots: true, Points: wall},
			},
		})
	}
	return f
}

// WritePlot writes a figure as SVG.
func WritePlot(w io.Writer, f Figure) error { return f.WriteSVG(w) }
