package bench

import (
	"fmt"
	"io"
)

// WriteTable prints the stall and whole-clone comparison.
func (r *StallResult) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "host: %s\n", r.Host)
	if r.Driver != "" {
		fmt.Fprintf(w, "vmfork driver: %s\n", r.Driver)
	}
	fmt.Fprintf(w, "client: one byte to an echo service in the source (busybox nc, port forward) every %s; windows from the call's start to %s after it returned; quiet windows of %s\n",
		fmtMS(r.IntervalMS), fmtMS(r.TailMS), fmtMS(r.QuietMS))
	for _, sz := range r.Sizes {
		use := "idle (as booted)"
		if sz.GuestUseMiB > 0 {
			use = fmt.Sprintf("holding %s of non-zero data", memLabel(sz.GuestUseMiB))
		}
		fmt.Fprintf(w, "\nstall at %s, %s: %d rounds, medians; source booted in %s\n", memLabel(sz.MemoryMiB), use, len(sz.Rounds), fmtMS(sz.SourceBootMS))
		tw := newTab(w)
		fmt.Fprintln(tw, "WINDOW\tLONGEST GAP\tP99 GAP\tGAP ACROSS THE PAUSE\tPAUSE (TIMED)")
		fmt.Fprintf(tw, "quiet (nothing happens)\t%s\t%s\t-\t-\n", fmtMS(sz.QuietMaxGapMS), fmtMS(sz.QuietP99GapMS))
		fmt.Fprintf(tw, "floor (stop, device state, cont)\t%s\t%s\t-\t%s\n", fmtMS(sz.FloorMaxGapMS), fmtMS(sz.FloorP99GapMS), fmtMS(sz.FloorPauseMS))
		fmt.Fprintf(tw, "vmfork fork\t%s\t%s\t%s\t%s\n", fmtMS(sz.ForkMaxGapMS), fmtMS(sz.ForkP99GapMS), fmtMS(sz.ForkAcrossPauseMS), fmtMS(sz.ForkPauseMS))
		tw.Flush()
		tw = newTab(w)
		fmt.Fprintln(tw, "ROUND\tQUIET\tFLOOR GAP\tFLOOR PAUSE\tFORK GAP\tACROSS PAUSE\tFORK PAUSE\tRAM MODE\tWHOLE CLONE")
		for _, rd := range sz.Rounds {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", rd.Round, fmtMS(rd.Quiet.MaxGapMS), fmtMS(rd.Floor.MaxGapMS),
				fmtMS(rd.FloorPauseMS), fmtMS(rd.Fork.MaxGapMS), fmtMS(rd.ForkAcrossPauseMS), fmtMS(rd.ForkPauseMS), orDash(rd.RAMMode), fmtMS(rd.CloneMS))
		}
		tw.Flush()
		fmt.Fprintf(w, "whole clone: vmfork fork call to first child READY %s", fmtMS(sz.CloneMS))
		if sz.SaveRestoreMS > 0 {
			fmt.Fprintf(w, "; virsh save %s + restore %s + agent %s = %s (with the save file's copy %s; save file %s)",
				fmtMS(sz.SaveMS), fmtMS(sz.RestoreMS), fmtMS(sz.AgentMS), fmtMS(sz.SaveRestoreMS), fmtMS(sz.WithCopyMS), fmtBytes(sz.SaveFileBytes))
		}
		fmt.Fprintln(w)
		for _, f := range sz.Fills {
			fmt.Fprintf(w, "guest use in %s: %s written in %s; guest MemAvailable %s -> %s of %s\n", f.Guest, fmtBytes(f.WrittenBytes),
				fmtMS(f.DurationMS), fmtBytes(f.Before.AvailableBytes), fmtBytes(f.After.AvailableBytes), fmtBytes(f.After.TotalBytes))
		}
		if len(sz.Fills) > 0 && r.Host.KSM {
			fmt.Fprintln(w, "WARNING: KSM runs on this host and may merge the fill's repeated MiB in every QEMU")
		}
		fmt.Fprintln(w)
		writeRatios(w, sz.Ratios)
	}
	return nil
}

// Figure draws, per size, the client's longest gaps and the whole clone.
func (r *StallResult) Figure() Figure {
	f := Figure{
		Title: "What a client of the source sees during a fork, and the whole clone",
		Notes: []string{"host: " + r.Host.Short(),
			fmt.Sprintf("medians of %d rounds; a byte echoed through a port forward every %s", r.Rounds, fmtMS(r.IntervalMS))},
		Columns: 2,
	}
	for _, sz := range r.Sizes {
		guest := memLabel(sz.MemoryMiB) + " guest"
		if sz.GuestUseMiB > 0 {
			guest += " using " + memLabel(sz.GuestUseMiB)
		}
		gap := func(label string, v float64, col string) Bar {
			return Bar{Label: label, Segments: []Segment{{Name: label, Value: v, Color: col}}, Text: fmtMS(v)}
		}
		gaps := BarPanel{Title: guest + ": client's longest gap between replies", Unit: "ms", Bars: []Bar{
			gap("quiet window", sz.QuietMaxGapMS, colFiles),
			gap("floor: stop, device state, cont", sz.FloorMaxGapMS, colOther),
			gap("vmfork fork", sz.ForkMaxGapMS, colVmfork),
		}}
		if sz.FloorMaxGapMS > 0 {
			gaps.Marks = []Mark{{Value: 1.5 * sz.FloorMaxGapMS, Label: "1.5x floor", Color: colBudget}}
		}
		clone := BarPanel{Title: guest + ": whole clone", Unit: "ms", Bars: []Bar{
			{Label: "vmfork fork to READY", Segments: []Segment{{Name: "fork call", Value: sz.CloneMS, Color: colVmfork}}, Text: fmtMS(sz.CloneMS)},
		}}
		if sz.SaveRestoreMS > 0 {
			clone.Bars = append(clone.Bars, Bar{Label: "virsh save + restore", Text: fmtMS(sz.SaveRestoreMS), Segments: []Segment{
				{Name: "save", Value: sz.SaveMS, Color: colLibvirt},
				{Name: "restore", Value: sz.RestoreMS, Color: colRunning},
				{Name: "until the agent answers", Value: sz.AgentMS, Color: colAgent},
			}})
		}
		f.Panels = append(f.Panels, gaps, clone)
		for _, ra := range sz.Ratios {
			if ra.Met != nil {
				f.Notes = append(f.Notes, fmt.Sprintf("%s: %s %s %s", guest, ra.Name, fmtRatio(ra), verdict(ra)))
			}
		}
	}
	return f
}
