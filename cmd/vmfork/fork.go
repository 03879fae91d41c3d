package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var forkCommand = &cli.Command{
	Name:      "fork",
	Usage:     "turn a machine into N+1 machines that continue from the same instant",
	ArgsUsage: "SOURCE [NAME...]",
	Description: `Forks SOURCE into children. A running source is paused for a fraction of a
second while its device state, disk and RAM are frozen into a template; then it
carries on, and each child continues from that instant with every process,
file and open connection of the source. Children share the template's RAM and
disk copy-on-write, so a child costs only what it changes.

A stopped source has only its disk: its children boot fresh from a
copy-on-write view of it.

Children are named NAME... or, with --count, PREFIX-1, PREFIX-2, ... (the next
free numbers; PREFIX defaults to SOURCE). When only some children come up,
those stay, the failures are listed and the exit code is 3.

   vmfork fork web --count 3
   vmfork fork web try-a try-b --json`,
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "count", Aliases: []string{"n"}, Usage: "number of children (default 1, or the number of NAMEs)"},
		&cli.StringFlag{Name: "prefix", Usage: "name children PREFIX-1, PREFIX-2, ... (default SOURCE)"},
		&cli.IntFlag{Name: "parallel", Aliases: []string{"j"}, Usage: "children started at once", Value: 4},
		&cli.IntFlag{Name: "max-children", Usage: "refuse a fork of more children than this", Value: vmfork.DefaultMaxChildren, EnvVars: []string{"VMFORK_MAX_CHILDREN"}},
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() < 1 {
			return usageError{errors.New("fork needs a source machine: vmfork fork SOURCE [NAME...]")}
		}
		req := vmfork.ForkRequest{
			Source:      cliCtx.Args().First(),
			Names:       cliCtx.Args().Tail(),
			Count:       cliCtx.Int("count"),
			Prefix:      cliCtx.String("prefix"),
			Parallel:    cliCtx.Int("parallel"),
			MaxChildren: cliCtx.Int("max-children"),
		}
		if cliCtx.IsSet("count") && req.Count < 1 {
			return usageError{fmt.Errorf("--count %d: want at least 1", req.Count)}
		}
		if req.Count == 0 && len(req.Names) == 0 {
			req.Count = 1
		}
		ctx, cancel := appContext(cliCtx)
		defer cancel()
		mg, err := newManager(cliCtx)
		if err != nil {
			return err
		}
		res, err := mg.Fork(ctx, req)
		if res == nil {
			return err
		}
		if cliCtx.Bool("json") {
			if perr := printJSON(res); perr != nil {
				return perr
			}
			return err
		}
		printFork(res)
		return err
	},
}

func printFork(res *vmfork.ForkResult) {
	fmt.Printf("forked %s at template %s (source paused %.1f ms)\n", res.Source, res.Template, res.PauseMS)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHILD\tSTATE\tPID\tRUNNING\tREADY\tPORTS")
	for _, c := range res.Children {
		var ports []string
		for _, p := range c.Ports {
			ports = append(ports, p.String())
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f ms\t%.0f ms\t%s\n", c.Name, c.State, c.PID, c.RunningMS, c.ReadyMS, orDash(strings.Join(ports, ",")))
	}
	for _, f := range res.Failed {
		fmt.Fprintf(tw, "%s\tfailed\t-\t-\t-\t%s\n", f.Name, f.Error)
	}
	tw.Flush()
}
