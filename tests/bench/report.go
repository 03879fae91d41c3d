package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Tables for people: one block per experiment, every figure with its unit,
// "-" where a figure does not apply.

func fmtMS(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v >= 10000:
		return fmt.Sprintf("%.1f s", v/1000)
	case v < 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.0f ms", v)
	}
}

func fmtBytes(b int64) string {
	switch {
	case b == 0:
		return "-"
	case b >= 2<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	default:
		return fmt.Sprintf("%.1f MiB", mib(b))
	}
}

func fmtFactor(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

func newTab(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// writeRatios prints targets and informative ratios.
func writeRatios(w io.Writer, rs []Ratio) {
	tw := newTab(w)
	fmt.Fprintln(tw, "COMPARISON\tVALUE\tTARGET\tRESULT")
	for _, r := range rs {
		result := ""
		if r.Met != nil {
			result = "met"
			if !*r.Met {
				result = "MISSED"
				switch {
				case r.Unit == "ms":
					result += fmt.Sprintf(" (off by %.0f ms)", r.By)
				case r.By >= 1.1:
					result += fmt.Sprintf(" (off by %.2fx)", r.By)
				case r.By > 0:
					result += fmt.Sprintf(" (off by %.1f%%)", 100*(r.By-1))
				}
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, fmtRatio(r), orDash(r.Target), result)
	}
	tw.Flush()
}

// fmtRatio prints a ratio's value, or a difference with its unit.
func fmtRatio(r Ratio) string {
	if r.Unit == "ms" {
		return fmt.Sprintf("%+.0f ms", r.Value)
	}
	return fmtFactor(r.Value)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteTable prints the peers comparison.
func (r *PeersResult) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "host: %s\n", r.Host)
	for _, sz := range r.Sizes {
		use := "guest use as booted"
		if sz.GuestUseMiB > 0 {
			use = fmt.Sprintf("guest use %d MiB (--guest-use %s) of non-zero data in each source", sz.GuestUseMiB, r.GuestUse)
		}
		fmt.Fprintf(w, "\npeers at %d MiB, %s: %d rounds, medians; memory (PSS) read %s after each child answered\n",
			sz.MemoryMiB, use, r.Rounds, fmtMS(r.SettleMS))
		tw := newTab(w)
		fmt.Fprintln(tw, "METHOD\tRUNNING\tAGENT ANSWERS\tREADY\tPSS\tSOURCE PAUSE\tWHOLE CLONE")
		for _, s := range sz.Summary {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Label, fmtMS(s.RunningMS), fmtMS(s.AgentMS),
				fmtMS(s.ReadyMS), fmtBytes(s.PSSBytes), fmtMS(s.PauseMS), fmtMS(s.WallMS))
		}
		tw.Flush()
		fmt.Fprintf(w, "source: booted in %s, RSS %s", fmtMS(sz.SourceBootMS), fmtBytes(sz.SourceRSSBytes))
		if sz.LibvirtBootMS > 0 {
			fmt.Fprintf(w, "; libvirt domain: booted (virsh create to agent) in %s", fmtMS(sz.LibvirtBootMS))
		}
		if sz.LibvirtDriverBootMS > 0 {
			fmt.Fprintf(w, "; libvirt driver's source: booted in %s", fmtMS(sz.LibvirtDriverBootMS))
		}
		fmt.Fprintln(w)
		writeCopies(w, sz)
		writeFills(w, sz, r.Host.KSM)
		if sz.KeptPauseMS > 0 {
			fmt.Fprintf(w, "kept template: the source paused %s once, when its instant was kept; its children pause nothing\n", fmtMS(sz.KeptPauseMS))
		}
		if find(sz.Summary, MethodLibvirtCreate).Samples > 0 {
			fmt.Fprintln(w, "virsh create --paused: libvirt starts a paused QEMU from the libvirt driver child's XML (another name, own overlay),")
			fmt.Fprintln(w, "  no state loaded: libvirt's own price of a start, under RUNNING; it includes one virsh process")
		}
		fmt.Fprintln(w)
		writeMemory(w, sz.Summary)
		fmt.Fprintln(w)
		writePhases(w, sz.Summary)
		fmt.Fprintln(w)
		writeRatios(w, sz.Ratios)
	}
	return nil
}

// writeCopies prints what each clone copied of the source's RAM: the
// freeze's template, virsh save's file. Both follow what the guest uses.
func writeCopies(w io.Writer, sz PeersSize) {
	var parts []string
	for _, s := range sz.Summary {
		if s.TemplateRAMBytes > 0 {
			parts = append(parts, fmt.Sprintf("%s froze %s of RAM", s.Label, fmtBytes(s.TemplateRAMBytes)))
		}
		if s.SaveFileBytes > 0 {
			parts = append(parts, fmt.Sprintf("virsh save wrote %s", fmtBytes(s.SaveFileBytes)))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "copied per clone (medians): %s\n", strings.Join(parts, "; "))
	}
}

// writeFills prints how each source got its guest use, from the guest's
// own /proc/meminfo.
func writeFills(w io.Writer, sz PeersSize, ksm bool) {
	if sz.GuestUseMiB == 0 {
		return
	}
	for _, f := range sz.Fills {
		fmt.Fprintf(w, "guest use in %s (source of %s): %s written in %s; guest MemFree %s -> %s, MemAvailable %s -> %s of %s\n",
			f.Guest, f.Source, fmtBytes(f.WrittenBytes), fmtMS(f.DurationMS), fmtBytes(f.Before.FreeBytes),
			fmtBytes(f.After.FreeBytes), fmtBytes(f.Before.AvailableBytes), fmtBytes(f.After.AvailableBytes), fmtBytes(f.After.TotalBytes))
	}
	fmt.Fprintln(w, "cold boot: a freshly booted guest cannot carry the guest use; its row is the guest as it boots")
	if ksm {
		fmt.Fprintln(w, "WARNING: KSM runs on this host and may merge the fill's repeated MiB in every QEMU")
	}
}

// writeMemory prints where each method's PSS goes.
func writeMemory(w io.Writer, ss []Summary) {
	tw := newTab(w)
	fmt.Fprintln(tw, "MEMORY PER CHILD (medians)\tGUEST RAM\tTCG CODE\tQEMU ANON\tFILES\tPSS")
	for _, s := range ss {
		if s.PSSBytes == 0 {
			continue // not a running child (virsh create --paused)
		}
		m := s.Memory
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Label, fmtBytes(m.GuestRAMBytes), fmtBytes(m.TCGBytes),
			fmtBytes(m.AnonBytes), fmtBytes(m.FileBytes), fmtBytes(s.PSSBytes))
	}
	tw.Flush()
	if kt := find(ss, MethodKept); kt.PoolIdle > 0 {
		fmt.Fprintf(w, "a kept template's warm-pool QEMU holds %s (PSS) while it waits for a fork\n", fmtBytes(kt.PoolIdle))
	}
}

// writePhases prints where each method's child time goes, vmfork's
// overhead over the floor phase by phase, and vmfork's identity chain.
func writePhases(w io.Writer, ss []Summary) {
	tw := newTab(w)
	fmt.Fprintln(tw, "PHASES (medians)\tQEMU START\tLOAD\tCONT\tRUNNING TO AGENT\tIDENTITY CHAIN\tSAVE\tCOPY\tRESTORE")
	for _, s := range ss {
		p := s.Phases
		if p == (Phases{}) {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Label, fmtMS(p.QEMUStartMS), fmtMS(p.LoadMS),
			fmtMS(p.ContMS), fmtMS(p.AgentMS), fmtMS(p.IdentityMS), fmtMS(p.SaveMS), fmtMS(p.CopyMS), fmtMS(p.RestoreMS))
	}
	tw.Flush()
	vs, fl := find(ss, MethodVmfork), find(ss, MethodFloor).Phases
	vf := vs.Phases
	if vf.QEMUStartMS > 0 && fl.QEMUStartMS > 0 {
		fmt.Fprintf(w, "vmfork over the floor: QEMU start %+.0f ms (overlay, records), load %+.0f ms (manifest check), "+
			"cont %+.0f ms (link down), agent %+.0f ms, identity chain %+.0f ms\n",
			vf.QEMUStartMS-fl.QEMUStartMS, vf.LoadMS-fl.LoadMS, vf.ContMS-fl.ContMS, vf.AgentMS-fl.AgentMS, vf.IdentityMS)
	}
	if len(vs.Steps) > 0 {
		var parts []string
		for _, st := range vs.Steps {
			parts = append(parts, fmt.Sprintf("%s %s", strings.TrimPrefix(st.Name, "vmfork."), fmtMS(st.DurationMS)))
		}
		fmt.Fprintf(w, "vmfork identity chain steps (medians): %s\n", strings.Join(parts, ", "))
	}
}

// WriteTable prints the burst.
func (r *BurstResult) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "host: %s\n\n", r.Host)
	state := "an idle"
	if r.Busy {
		state = "a busy (counter running)"
	}
	fmt.Fprintf(w, "burst: %d children of %s %s source in one fork call, %d at a time\n",
		r.Count, state, memLabel(r.MemoryMiB), r.Parallel)
	tw := newTab(w)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("source pause", fmtMS(r.PauseMS))
	row("fork call until all answered", fmt.Sprintf("%s (%d ready, %d answered a ping after)", fmtMS(r.WallMS), r.Ready, r.Answered))
	row("children per second", fmt.Sprintf("%.2f", r.ChildrenPerSecond))
	row("ready curve", readyQuantiles(r.ReadyAtMS, r.Count))
	row("child running (median / p90 / max)", spreadMS(r.RunningMS))
	row("child agent answers (median / p90 / max)", spreadMS(r.AgentMS))
	row("child ready (median / p90 / max)", spreadMS(r.ReadyMS))
	row(fmt.Sprintf("total PSS of the children, %s after", fmtMS(r.SettleMS)),
		fmt.Sprintf("%s = %.1f%% of %d x %s (%s)", fmtBytes(r.TotalPSSBytes), 100*r.PSSShare, r.Count,
			memLabel(r.MemoryMiB), fmtBytes(r.GuestRAMBytes)))
	row("child PSS (median / p90 / max)", fmt.Sprintf("%s / %s / %s", fmtBytes(int64(r.ChildPSSBytes.Median)),
		fmtBytes(int64(r.ChildPSSBytes.P90)), fmtBytes(int64(r.ChildPSSBytes.Max))))
	cm := r.ChildMemory
	row("child PSS by kind (medians)", fmt.Sprintf("guest RAM %s, TCG code %s, QEMU anon %s, files %s",
		fmtBytes(cm.GuestRAMBytes), fmtBytes(cm.TCGBytes), fmtBytes(cm.AnonBytes), fmtBytes(cm.FileBytes)))
	row("frozen template RAM (allocated)", fmtBytes(r.TemplateRAMBytes))
	row("source PSS", fmtBytes(r.SourcePSSBytes))
	row("host MemAvailable before / after", fmt.Sprintf("%s / %s (%s used)", fmtBytes(r.MemAvailBefore),
		fmtBytes(r.MemAvailAfter), fmtBytes(r.MemAvailBefore-r.MemAvailAfter)))
	if c := r.CPU; c != nil && len(c.Samples) > 0 {
		cs := c.CoreSeconds
		all := cs.busy() + cs.HostIdle
		share := func(v float64) string { return fmt.Sprintf("%.1f CPU s (%.0f%%)", v, 100*v/all) }
		row(fmt.Sprintf("CPU of the call, %d CPUs x %.0f s", c.CPUs, all/float64(c.CPUs)), "")
		row("  READY children, idle", share(cs.IdleChildren))
		row("  children starting (QEMU + chain)", share(cs.ChainChildren))
		row("  vmfork + source", share(cs.Vmfork+cs.Source))
		row("  other processes, kernel", share(cs.Other))
		row("  free", share(cs.HostIdle))
		row("child's CPU until READY (median / p90 / max)", fmt.Sprintf("%.2f s / %.2f s / %.2f s",
			c.ChainCPUSeconds.Median, c.ChainCPUSeconds.P90, c.ChainCPUSeconds.Max))
		row("one idle READY child", fmt.Sprintf("%.1f%% of a core", 100*c.IdleChildCores))
	}
	for _, f := range r.Failed {
		row("failed: "+f.Name, f.Error)
	}
	tw.Flush()
	fmt.Fprintln(w)
	writeRatios(w, r.Ratios)
	return nil
}

func spreadMS(s Spread) string {
	return fmt.Sprintf("%s / %s / %s", fmtMS(s.Median), fmtMS(s.P90), fmtMS(s.Max))
}

// readyQuantiles says when 10%, 50%, 90% and all of the children were ready.
func readyQuantiles(at []float64, n int) string {
	if len(at) == 0 || n == 0 {
		return "-"
	}
	var parts []string
	for _, q := range []int{10, 50, 90, 100} {
		k := (q*n + 99) / 100
		if k > len(at) {
			parts = append(parts, fmt.Sprintf("%d%%: never", q))
			continue
		}
		parts = append(parts, fmt.Sprintf("%d%% at %s", q, fmtMS(at[max(k, 1)-1])))
	}
	return strings.Join(parts, ", ")
}

// WriteTable prints both sweeps and the growth exponents.
func (r *ScaleResult) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "host: %s\n", r.Host)
	if len(r.ByMemory) > 0 {
		fmt.Fprintf(w, "\nscale by guest RAM: one child per call, %d rounds, medians\n", r.Rounds)
		tw := newTab(w)
		fmt.Fprintln(tw, "GUEST RAM\tUSED\tSOURCE PAUSE\tPAUSE FLOOR\tFROZEN RAM\tCHILD RUNNING\tCHILD READY\tWHOLE CALL\tSOURCE BOOT")
		for _, p := range r.ByMemory {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", memLabel(p.MemoryMiB), usedLabel(p.UsedMiB), fmtMS(p.PauseMS), fmtMS(p.PauseFloorMS),
				fmtBytes(p.TemplateRAMBytes), fmtMS(p.RunningMS), fmtMS(p.ReadyMS), fmtMS(p.WallMS), fmtMS(p.SourceBootMS))
		}
		tw.Flush()
	}
	if len(r.ByDepth) > 0 {
		fmt.Fprintf(w, "\nscale by depth: fork of a fork of ..., %s guest using %s, %d rounds, medians\n",
			memLabel(r.ByDepth[0].MemoryMiB), usedLabel(r.ByDepth[0].UsedMiB), r.Rounds)
		tw := newTab(w)
		fmt.Fprintln(tw, "DEPTH\tSOURCE PAUSE\tPAUSE FLOOR\tCHILD RUNNING\tCHILD READY")
		for _, p := range r.ByDepth {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", p.Depth, fmtMS(p.PauseMS), fmtMS(p.PauseFloorMS), fmtMS(p.RunningMS), fmtMS(p.ReadyMS))
		}
		tw.Flush()
	}
	if len(r.ByChildren) > 0 {
		fmt.Fprintf(w, "\nscale by children per call: %s guest, %d started at once, %d rounds, medians\n",
			memLabel(r.ChildMemoryMiB), r.Parallel, r.Rounds)
		tw := newTab(w)
		fmt.Fprintln(tw, "CHILDREN\tSOURCE PAUSE\tCHILD RUNNING\tCHILD READY\tLAST CHILD READY\tWHOLE CALL\tCALL PER CHILD")
		for _, p := range r.ByChildren {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Children, fmtMS(p.PauseMS), fmtMS(p.RunningMS),
				fmtMS(p.ReadyMS), fmtMS(p.LastMS), fmtMS(p.WallMS), fmtMS(p.WallMS/float64(p.Children)))
		}
		tw.Flush()
	}
	if l := r.Loop; l != nil {
		fmt.Fprintf(w, "\nagent loop: %d forks of one source, each child removed, %s written in between\n", l.Forks, fmtBytes(l.WrittenBytes))
		fmt.Fprintf(w, "pause first quarter %s, last quarter %s (medians), median %s; source PSS after the first %s, after the last %s; mem dir %s -> %s\n",
			fmtMS(l.FirstQuarterMS), fmtMS(l.LastQuarterMS), fmtMS(l.MedianPauseMS), fmtBytes(l.FirstPSSBytes), fmtBytes(l.LastPSSBytes),
			fmtBytes(l.MemDirAfterFirst), fmtBytes(l.MemDirAfterLast))
	}
	if len(r.Growth) > 0 {
		fmt.Fprintln(w)
		writeRatios(w, r.Growth)
	}
	return nil
}
