// Command burstruns draws several `vmfork bench burst` runs in one SVG from
// their --csv and --cpu-csv files (docs/BENCHMARKS.md, "Burst"):
//
//	go run ./tests/bench/burstruns -o docs/bench-burst-runs.svg DIR/run1 DIR/run2 DIR/run3
//
// reads DIR/runN-children.csv and DIR/runN-cpu.csv for each run.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vmfork/vmfork/tests/bench"
)

func main() {
	out := flag.String("o", "", "SVG file to write")
	cpus := flag.Int("cpus", 2, "the host's CPUs")
	title := flag.String("title", "Bursts of 100 children of a 256M guest", "figure title")
	ref := flag.String("ref", "", "a reference curve known by its quantiles: NAME:SECONDS@PERCENT,... of -count children")
	count := flag.Int("count", 100, "children per run (for -ref)")
	var notes multi
	flag.Var(&notes, "note", "a note under the title (repeatable)")
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: burstruns -o OUT.svg [-ref NAME:S@P,...] [-note TEXT] RUN...")
		os.Exit(2)
	}
	var runs []bench.BurstRun
	for _, p := range flag.Args() {
		r, err := bench.ReadBurstRun(filepath.Base(p), p+"-children.csv", p+"-cpu.csv", *cpus)
		if err != nil {
			fmt.Fprintln(os.Stderr, "burstruns:", err)
			os.Exit(1)
		}
		runs = append(runs, r)
	}
	refSeries, err := parseRef(*ref, *count)
	if err != nil {
		fmt.Fprintln(os.Stderr, "burstruns: -ref:", err)
		os.Exit(2)
	}
	var b bytes.Buffer
	if err := bench.BurstRunsFigure(*title, notes, runs, refSeries).WriteSVG(&b); err != nil {
		fmt.Fprintln(os.Stderr, "burstruns:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "burstruns:", err)
		os.Exit(1)
	}
}

// parseRef reads NAME:S@P,S@P...: at S seconds, P percent of count were
// READY.
func parseRef(s string, count int) (bench.Series, error) {
	if s == "" {
		return bench.Series{}, nil
	}
	name, pts, ok := strings.Cut(s, ":")
	if !ok {
		return bench.Series{}, fmt.Errorf("%q: want NAME:SECONDS@PERCENT,...", s)
	}
	ser := bench.Series{Name: name, Color: "#c92a2a", Dashed: true, Dots: true, Points: []bench.Point{{X: 0, Y: 0}}}
	for _, p := range strings.Split(pts, ",") {
		sec, pct, ok := strings.Cut(p, "@")
		x, err1 := strconv.ParseFloat(sec, 64)
		y, err2 := strconv.ParseFloat(pct, 64)
		if !ok || err1 != nil || err2 != nil {
			return bench.Series{}, fmt.Errorf("%q: want SECONDS@PERCENT", p)
		}
		ser.Points = append(ser.Points, bench.Point{X: x, Y: y * float64(count) / 100})
	}
	return ser, nil
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, "; ") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }
