//go:build bench

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/tests/bench"
)

func init() { extraCommands = append(extraCommands, benchCommand) }

var benchCommand = &cli.Command{
	Name:  "bench",
	Usage: "measure vmfork against its peers on this host: peers, burst, scale, stall",
	Description: `Boots the project's test guest (make guest) and measures, in one run on this
host, what vmfork costs next to what you would do without it. Every figure comes
with its reference from the same run; compare ratios, not absolutes.

   vmfork bench peers     one child made each way: vmfork fork, the bare-QEMU
                          floor, a kept template's warm pool, libvirt save+restore,
                          a cold boot, vmfork's libvirt driver next to virsh
                          create --paused; time to running and ready, memory
   vmfork bench burst     N children from one source in one fork call
   vmfork bench scale     pause and child time as guest RAM and children grow
   vmfork bench stall     the stall a client of the source sees during a fork,
                          and the whole clone against virsh save + restore

Each prints a table on stdout (one JSON document with --json), writes an SVG
plot with --plot FILE and shows progress on stderr. The run uses its own
temporary state dir, mem dir and libvirt domains, and removes all of them when
it ends, also on failure or Ctrl-C. It needs root (QEMU, libvirt) and, for the
libvirt comparator, a running libvirtd (scripts/libvirtd.sh starts one).
Full-size runs take many minutes and load every core: on a shared host, try
small sizes first (--memory 256M --rounds 1, --count 5).`,
	Subcommands: []*cli.Command{benchPeersCommand, benchBurstCommand, benchScaleCommand, benchStallCommand},
}

// Flags every bench subcommand has.
var benchCommonFlags = []cli.Flag{
	&cli.StringFlag{Name: "guest", Usage: "directory of the built test guest (make guest), or of the Debian guest (make guest-debian: /var/cache/vmfork/debian-guest)", Value: defaultGuestDir(), EnvVars: []string{"VMFORK_GUEST"}},
	&cli.StringFlag{Name: "guest-variant", Usage: "the Debian guest's variant, a name from its variants file (default: the first, ifupdown-dbus)"},
	&cli.StringFlag{Name: "plot", Usage: "also write the figures as an SVG image to `FILE`"},
	&cli.DurationFlag{Name: "settle", Usage: "how long each child runs after it answered before its memory is read", Value: 2 * time.Second},
	jsonFlag,
}

var benchPeersCommand = &cli.Command{
	Name:  "peers",
	Usage: "one child each way, alternated over rounds: medians and ratios",
	Description: `For each --memory size, boots a source (a counter runs in it) and a plain
libvirt domain of the same guest, then per round makes one child each way, in
an order that rotates between rounds:

   vmfork fork           the live fork of the running source (ForkResult's times)
   floor                 a bare qemu-system-x86_64 -incoming defer of the same
                         configuration loading the same template, timed from
                         spawn; nothing of vmfork around it
   kept template         the source's instant kept once (template save, its
                         pause reported apart) with a warm pool of one; each
                         child is a fork of the template, from the pool
   libvirt save+restore  virsh save (the domain stops), virsh restore of a copy
                         of the save file, until guest-ping answers through
                         libvirt. A restored copy cannot run next to its
                         original (same name and uuid), so the restore is the
                         per-child time and the source's pause is save+restore
   cold boot             the same guest booted from scratch; it cannot carry
                         --guest-use (a fresh guest is empty)
   libvirt driver        vmfork fork of a source booted through the libvirt
                         driver (vmfork -c), in its own state dir; next to it,
                         libvirt's own start of the same child XML under
                         another name: virsh create --paused (no state loaded),
                         under RUNNING. Needs "vmfork libvirt setup" once.

--guest-use fills each source guest (vmfork's, the libvirt domain, the libvirt
driver's) with that much non-zero data before the rounds, in a tmpfs in the
guest: a guest that uses its RAM, as a desktop or an agent's machine mid-run
does. virsh save and vmfork's freeze both copy what the guest uses, so both
grow with it; the table says what each copied and what the guests' own
/proc/meminfo showed.

RUNNING is until the child's vCPUs run, AGENT ANSWERS until its guest agent
first answers, READY until it is usable: for vmfork that is after its identity
chain (hostname, MAC, machine-id, keys...), which a libvirt clone does not get.
PSS is read --settle after READY, counting the template pages a child touched
in full (as if it were its template's only child), and is split into guest RAM,
TCG code, QEMU's other anonymous memory and files. The targets of issue 6 are
checked at the end of each table.

   vmfork bench peers --memory 256M --rounds 1          (a quick look)
   vmfork bench peers --memory 512M --rounds 1 --guest-use 50% --methods vmfork,libvirt_restore,libvirt_driver
   vmfork bench peers --plot docs/bench-peers.svg       (512M and 2G, 5 rounds)`,
	Flags: append([]cli.Flag{
		&cli.StringFlag{Name: "memory", Aliases: []string{"m"}, Usage: "guest RAM sizes, comma-separated", Value: "512M,2G"},
		&cli.IntFlag{Name: "rounds", Usage: "children made each way per size", Value: 5},
		&cli.StringFlag{Name: "libvirt", Usage: "libvirt URI of the save/restore comparator", Value: "qemu:///system"},
		&cli.BoolFlag{Name: "no-libvirt", Usage: "leave the libvirt comparators (restore, libvirt driver) out"},
		&cli.StringFlag{Name: "guest-use", Usage: "RAM each source guest holds in use (non-zero data) before the rounds: a share of its RAM such as 75% or a size such as 1536M; 0 leaves the guests as they boot", Value: "0"},
		&cli.StringFlag{Name: "methods", Usage: "methods to measure, comma-separated, of vmfork,floor,kept_template,libvirt_restore,cold_boot,libvirt_driver", Value: "all"},
	}, benchCommonFlags...),
	Action: func(cliCtx *cli.Context) error {
		mems, err := parseMemories(cliCtx.String("memory"))
		if err != nil {
			return err
		}
		use, err := bench.ParseGuestUse(cliCtx.String("guest-use"))
		if err != nil {
			return usageError{fmt.Errorf("--guest-use: %w", err)}
		}
		methods, err := bench.ParseMethods(cliCtx.String("methods"))
		if err != nil {
			return usageError{fmt.Errorf("--methods: %w", err)}
		}
		opt := bench.PeersOptions{MemoryMiB: mems, Rounds: cliCtx.Int("rounds"), GuestUse: use, Methods: methods}
		if opt.Rounds < 1 {
			return usageError{fmt.Errorf("--rounds %d: want at least 1", opt.Rounds)}
		}
		for _, m := range mems {
			if _, err := use.MiBFor(m); err != nil {
				return usageError{fmt.Errorf("--guest-use: %w", err)}
			}
		}
		uri := cliCtx.String("libvirt")
		if cliCtx.Bool("no-libvirt") {
			uri = ""
		}
		return runBench(cliCtx, uri, func(ctx context.Context, e *bench.Env) (benchResult, error) {
			r, err := bench.Peers(ctx, e, opt)
			if r == nil {
				return nil, err // nothing measured (a check failed before anything booted)
			}
			return r, err
		})
	},
}

var benchBurstCommand = &cli.Command{
	Name:  "burst",
	Usage: "N children from one source in one fork call, as a VDI morning",
	Description: `Boots one source and forks --count children from it in one call, --parallel
started at once. Reports the source's pause, the time until every child's guest
agent answered, children per second, a curve of ready children over time, the
children's total and per-child PSS against N x guest RAM, and the host's
MemAvailable before and after. The children are removed at the end.

While the call runs, the host's CPU (/proc/stat) and every QEMU's
(/proc/PID/stat) are sampled each second and split between children already
READY (idle: under TCG each still costs a few percent of a core), children
starting (their QEMU and identity chain), vmfork and the source, and
everything else: where the burst's time goes. --json has every child's
timeline and every sample; --csv and --cpu-csv write them as CSV.

   vmfork bench burst --count 5                      (a quick look)
   vmfork bench burst --plot docs/bench-burst.svg    (100 children of 256 MiB)
   vmfork bench burst --csv children.csv --cpu-csv cpu.csv`,
	Flags: append([]cli.Flag{
		&cli.IntFlag{Name: "count", Aliases: []string{"n"}, Usage: "children", Value: 100},
		&cli.IntFlag{Name: "parallel", Aliases: []string{"j"}, Usage: "children started at once", Value: 4},
		&cli.StringFlag{Name: "memory", Aliases: []string{"m"}, Usage: "guest RAM", Value: "256M"},
		&cli.BoolFlag{Name: "busy", Usage: "run the test guest's counter in the source (and so in every child); by default it idles, as desktops waiting for their users do"},
		&cli.StringFlag{Name: "csv", Usage: "also write each child's started, running and READY moments to `FILE` as CSV"},
		&cli.StringFlag{Name: "cpu-csv", Usage: "also write the CPU samples (cores by whom, each second) to `FILE` as CSV"},
	}, benchCommonFlags...),
	Action: func(cliCtx *cli.Context) error {
		mem, err := vmfork.ParseMemory(cliCtx.String("memory"))
		if err != nil {
			return usageError{fmt.Errorf("--memory: %w", err)}
		}
		opt := bench.BurstOptions{Count: cliCtx.Int("count"), Parallel: cliCtx.Int("parallel"), MemoryMiB: mem, Busy: cliCtx.Bool("busy")}
		if opt.Count < 1 || opt.Parallel < 1 {
			return usageError{errors.New("--count and --parallel must be at least 1")}
		}
		// The files are written after minutes of burst: a missing
		// directory is said before anything boots.
		for _, f := range []string{"csv", "cpu-csv"} {
			if p := cliCtx.String(f); p != "" {
				if fi, err := os.Stat(filepath.Dir(p)); err != nil || !fi.IsDir() {
					return usageError{fmt.Errorf("--%s %s: no directory %s to write it in", f, p, filepath.Dir(p))}
				}
			}
		}
		return runBench(cliCtx, "", func(ctx context.Context, e *bench.Env) (benchResult, error) {
			r, err := bench.Burst(ctx, e, opt)
			if r != nil && ctx.Err() == nil {
				for _, out := range []struct {
					path  string
					write func(io.Writer) error
				}{{cliCtx.String("csv"), r.WriteChildrenCSV}, {cliCtx.String("cpu-csv"), r.WriteCPUCSV}} {
					if out.path != "" {
						err = errors.Join(err, writeCSV(out.path, out.write))
					}
				}
			}
			return r, err
		})
	},
}

var benchScaleCommand = &cli.Command{
	Name:  "scale",
	Usage: "pause and child time as guest RAM and children per call grow",
	Description: `Two sweeps. By guest RAM: a source of each --memory size, one child per
fork call, --rounds times. By children per call: one source of --child-memory,
forked into each --children count, --rounds times. Reports medians and the
growth exponent k (time ~ size^k) from the first to the last point: 1 grows as
fast as guest RAM, 0 not at all.

   vmfork bench scale --memory 256M,512M --children 1,2 --rounds 1   (quick)
   vmfork bench scale --plot docs/bench-scale.svg                    (full)`,
	Flags: append([]cli.Flag{
		&cli.StringFlag{Name: "memory", Aliases: []string{"m"}, Usage: "guest RAM sizes of the RAM sweep", Value: "256M,512M,1G,2G,4G"},
		&cli.StringFlag{Name: "children", Usage: "children per call of the children sweep", Value: "1,2,4,8,16,32"},
		&cli.StringFlag{Name: "child-memory", Usage: "guest RAM of the children sweep", Value: "256M"},
		&cli.IntFlag{Name: "parallel", Aliases: []string{"j"}, Usage: "children started at once", Value: 4},
		&cli.IntFlag{Name: "rounds", Usage: "fork calls per point", Value: 3},
		&cli.StringFlag{Name: "guest-use", Usage: "non-zero data written into each source of the RAM sweep: one value (75%, 1536M) or one per --memory size", Value: "0"},
		&cli.IntFlag{Name: "depth", Usage: "add the depth sweep: fork a child of a child ... this many levels deep"},
		&cli.StringFlag{Name: "depth-use", Usage: "non-zero data in the depth sweep's source", Value: "50%"},
		&cli.BoolFlag{Name: "no-children-sweep", Usage: "skip the children-per-call sweep"},
		&cli.IntFlag{Name: "loop", Usage: "add an agent's loop: this many forks of one source, each child removed before the next"},
	}, benchCommonFlags...),
	Action: func(cliCtx *cli.Context) error {
		var uses []bench.GuestUse
		for _, f := range strings.Split(cliCtx.String("guest-use"), ",") {
			u, err := bench.ParseGuestUse(f)
			if err != nil {
				return usageError{fmt.Errorf("--guest-use: %w", err)}
			}
			uses = append(uses, u)
		}
		depthUse, err := bench.ParseGuestUse(cliCtx.String("depth-use"))
		if err != nil {
			return usageError{fmt.Errorf("--depth-use: %w", err)}
		}
		mems, err := parseMemories(cliCtx.String("memory"))
		if err != nil {
			return err
		}
		kids, err := parseInts(cliCtx.String("children"))
		if err != nil {
			return err
		}
		cm, err := vmfork.ParseMemory(cliCtx.String("child-memory"))
		if err != nil {
			return usageError{fmt.Errorf("--child-memory: %w", err)}
		}
		opt := bench.ScaleOptions{MemoryMiB: mems, Children: kids, ChildMemoryMiB: cm,
			Parallel: cliCtx.Int("parallel"), Rounds: cliCtx.Int("rounds"),
			GuestUse: uses, Depth: cliCtx.Int("depth"), DepthUse: depthUse, NoChildrenSweep: cliCtx.Bool("no-children-sweep"), Loop: cliCtx.Int("loop")}
		if opt.Rounds < 1 || opt.Parallel < 1 || opt.Depth < 0 || opt.Loop < 0 {
			return usageError{errors.New("--rounds and --parallel must be at least 1, --depth at least 0")}
		}
		if len(uses) > 1 && len(uses) != len(mems) {
			return usageError{fmt.Errorf("--guest-use has %d values for %d --memory sizes", len(uses), len(mems))}
		}
		return runBench(cliCtx, "", func(ctx context.Context, e *bench.Env) (benchResult, error) {
			return bench.Scale(ctx, e, opt)
		})
	},
}

// benchResult is what every experiment returns.
type benchResult interface {
	WriteTable(io.Writer) error
	Figure() bench.Figure
}

// runBench sets a run up, runs it, prints what it measured (also a partial
// result before an error) and removes everything the run started.
func runBench(cliCtx *cli.Context, libvirtURI string, run func(context.Context, *bench.Env) (benchResult, error)) (err error) {
	plot := cliCtx.String("plot")
	if plot != "" && !strings.EqualFold(filepath.Ext(plot), ".svg") {
		return usageError{fmt.Errorf("--plot %s: only SVG is written; name the file .svg", plot)}
	}
	guest, err := filepath.Abs(cliCtx.String("guest"))
	if err != nil {
		return usageError{err}
	}
	ctx, cancel := appContext(cliCtx)
	defer cancel()
	cfg := bench.Config{GuestDir: guest, GuestVariant: cliCtx.String("guest-variant"), LibvirtURI: libvirtURI, Settle: cliCtx.Duration("settle")}
	if !cliCtx.Bool("quiet") {
		cfg.Progress = newProgress(os.Stderr)
	}
	if logrus.GetLevel() >= logrus.DebugLevel {
		cfg.Log, cfg.Debug = os.Stderr, true
	}
	e, err := bench.NewEnv(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "vmfork bench: interrupted; removing everything the run started")
		}
		if cerr := e.Close(ctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("bench cleanup: %w", cerr))
		}
	}()
	res, err := run(ctx, e)
	if cfg.Progress != nil {
		fmt.Fprintln(os.Stderr)
	}
	// Every experiment returns what it measured, also with an error; after
	// a Ctrl-C the user wants the prompt back, not half a table.
	if ctx.Err() != nil || res == nil {
		return err
	}
	if plot != "" {
		if perr := writePlot(plot, res.Figure()); perr != nil {
			err = errors.Join(err, perr)
		}
	}
	if cliCtx.Bool("json") {
		return errors.Join(err, printJSON(res))
	}
	return errors.Join(err, res.WriteTable(os.Stdout))
}

// writeCSV writes a CSV file through a temporary file.
func writeCSV(path string, write func(io.Writer) error) error {
	var b bytes.Buffer
	if err := write(&b); err != nil {
		return fmt.Errorf("csv %s: %w", path, err)
	}
	if err := vmfork.WriteFileAtomic(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("csv %s: %w", path, err)
	}
	return nil
}

// writePlot writes the SVG through a temporary file, so a reader never sees
// half a plot.
func writePlot(path string, f bench.Figure) error {
	var b bytes.Buffer
	if err := f.WriteSVG(&b); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if err := vmfork.WriteFileAtomic(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	return nil
}

// newProgress reports steps on w: one redrawn line with a bar on a
// terminal, a line per step otherwise (logs, CI).
func newProgress(w *os.File) func(bench.Progress) {
	_, terr := unix.IoctlGetTermios(int(w.Fd()), unix.TCGETS)
	tty := terr == nil
	start := time.Now()
	return func(p bench.Progress) {
		elapsed := time.Since(start).Round(time.Second)
		if !tty {
			fmt.Fprintf(w, "[%d/%d %v] %s\n", p.Done, p.Total, elapsed, p.Step)
			return
		}
		const width = 24
		n := 0
		if p.Total > 0 {
			n = width * p.Done / p.Total
		}
		bar := strings.Repeat("#", n) + strings.Repeat(".", width-n)
		line := fmt.Sprintf("[%s] %d/%d %v %s", bar, p.Done, p.Total, elapsed, p.Step)
		if len(line) > 110 {
			line = line[:110]
		}
		fmt.Fprintf(w, "\r\033[K%s", line)
	}
}

// defaultGuestDir is tests/guest/out of the repository this binary was
// built in (bin/vmfork sits in the repository), else of the current
// directory. VMFORK_GUEST overrides it.
func defaultGuestDir() string {
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Join(filepath.Dir(filepath.Dir(exe)), "tests", "guest", "out")
		if _, err := os.Stat(filepath.Join(dir, "vmlinuz")); err == nil {
			return dir
		}
	}
	return filepath.Join("tests", "guest", "out")
}

func parseMemories(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		m, err := vmfork.ParseMemory(f)
		if err != nil {
			return nil, usageError{fmt.Errorf("--memory: %w", err)}
		}
		out = append(out, m)
	}
	return out, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, usageError{fmt.Errorf("--children %q: want positive numbers separated by commas", s)}
		}
		out = append(out, n)
	}
	return out, nil
}
