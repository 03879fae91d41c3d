package bench

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
)

// BurstRun is one `vmfork bench burst` read back from its --csv and
// --cpu-csv files, to draw several runs in one figure (BurstRunsFigure).
type BurstRun struct {
	Name     string
	Children []BurstChild
	CPU      BurstCPU
}

// ReadBurstRun reads a run's children and CPU CSV files.
func ReadBurstRun(name, childrenCSV, cpuCSV string, cpus int) (BurstRun, error) {
	r := BurstRun{Name: name, CPU: BurstCPU{CPUs: cpus}}
	rows, err := readCSV(childrenCSV, 6)
	if err != nil {
		return r, err
	}
	for _, row := range rows {
		v := floats(row[1:])
		r.Children = append(r.Children, BurstChild{Name: row[0], StartedMS: v[0], RunningMS: v[1], ReadyMS: v[2], FailedMS: v[3], ChainCPUS: v[4]})
	}
	rows, err = readCSV(cpuCSV, 10)
	if err != nil {
		return r, err
	}
	last := 0.0
	for _, row := range rows {
		v := floats(row)
		s := CPUSample{AtMS: v[0], Ready: int(v[1]), InChain: int(v[2]), CPUPressure: v[9],
			CPUSplit: CPUSplit{IdleChildren: v[3], ChainChildren: v[4], Source: v[5], Vmfork: v[6], Other: v[7], HostIdle: v[8]}}
		r.CPU.Samples = append(r.CPU.Samples, s)
		r.CPU.CoreSeconds.add(s.CPUSplit, (s.AtMS-last)/1000)
		last = s.AtMS
	}
	return r, nil
}

func readCSV(path string, cols int) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cr := csv.NewReader(f)
	cr.FieldsPerRecord = cols
	var out [][]string
	for first := true; ; first = false {
		row, err := cr.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if !first {
			out = append(out, row)
		}
	}
}

// floats reads cells as numbers; an empty cell (never got there) is 0.
func floats(cells []string) []float64 {
	out := make([]float64, len(cells))
	for i, c := range cells {
		out[i], _ = strconv.ParseFloat(c, 64)
	}
	return out
}

// readyCurve returns the cumulative READY children over time, in seconds.
func readyCurve(cs []BurstChild) []Point {
	var at []float64
	for _, c := range cs {
		if c.ReadyMS > 0 {
			at = append(at, c.ReadyMS)
		}
	}
	slices.Sort(at)
	pts := []Point{{0, 0}}
	for i, t := range at {
		pts = append(pts, Point{t / 1000, float64(i + 1)})
	}
	return pts
}

// BurstRunsFigure draws several runs' ready curves against a reference
// (points of another run known only by its quantiles), and each run's CPU
// by whom.
func BurstRunsFigure(title string, notes []string, runs []BurstRun, ref Series) Figure {
	colors := []string{colVmfork, colRunning, colIdentity, colLibvirt, colTCG}
	curves := []Series{}
	if len(ref.Points) > 0 {
		curves = append(curves, ref)
	}
	var bars []Bar
	for i, r := range runs {
		curves = append(curves, Series{Name: r.Name, Color: colors[i%len(colors)], Step: true, Points: readyCurve(r.Children)})
		cs := r.CPU.CoreSeconds
		bars = append(bars, Bar{Label: r.Name, Segments: []Segment{
			{Name: "READY children, idle", Value: cs.IdleChildren, Color: colIdleKids},
			{Name: "children starting", Value: cs.ChainChildren, Color: colChainKids},
			{Name: "vmfork + source", Value: cs.Vmfork + cs.Source, Color: colOurs},
			{Name: "other processes, kernel", Value: cs.Other, Color: colElse},
			{Name: "free", Value: cs.HostIdle, Color: colFree},
		}})
	}
	panels := []Panel{LinePanel{Title: "READY children (cumulative)", XLabel: "seconds since the fork call", YLabel: "children", Series: curves, Height: 360}}
	if len(ref.Points) > 0 {
		// The runs alone too: next to a much slower reference their
		// curves are squeezed against the axis.
		panels = append(panels, LinePanel{Title: "READY children (cumulative), these runs only", XLabel: "seconds since the fork call", YLabel: "children", Series: curves[1:], Height: 320})
	}
	panels = append(panels, BarPanel{Title: "the fork call's CPU time by whom (2 CPUs x the call)", Unit: "CPU s", Bars: bars})
	return Figure{Title: title, Notes: notes, Columns: 1, Panels: panels}
}
