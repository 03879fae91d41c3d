package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var templateCommand = &cli.Command{
	Name:  "template",
	Usage: "keep a machine's instant by name, to fork children from it later",
	Description: `A kept template is a fork point with a name. "template save" freezes a running
machine once (it pauses as for a fork, then carries on); "vmfork fork NAME"
then makes children that continue from that instant, any time later and as
often as wanted, without touching the source again. The template's RAM and
disk stay until "template rm", and after that until its last child is gone.

A warm pool (--pool K) keeps K QEMU processes of the template started ahead,
waiting: a fork takes them first and only loads the device state, so QEMU's
start is off the child's critical path. Each waiting process holds some tens
of MiB; the pool is refilled at the end of every fork from the template.

   vmfork template save desktop golden --pool 4
   vmfork fork golden --count 100
   vmfork template ls
   vmfork template pool golden 8
   vmfork template rm golden`,
	Subcommands: []*cli.Command{templateSaveCommand, templateLsCommand, templatePoolCommand, templateRmCommand, templateExportCommand, templateImportCommand, templatePushCommand, templatePullCommand, templateServeCommand},
}

var templateSaveCommand = &cli.Command{
	Name:      "save",
	Usage:     "keep running machine SOURCE's current instant as template NAME",
	ArgsUsage: "SOURCE NAME",
	Description: `Freezes SOURCE (a pause of a fraction of a second, as for a fork; its
pre-fork hooks run first) into a template named NAME. NAME shares the
namespace of machine names. With --pool K, K processes are started ahead.`,
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "pool", Usage: fmt.Sprintf("processes to keep started ahead (0 to %d)", vmfork.MaxPoolSize)},
		ttlFlag,
		contractFlag,
		dryRunFlag,
		jsonFlag,
		traceJSONFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 2 {
			return usageError{errors.New("template save needs a running machine and a name: vmfork template save SOURCE NAME")}
		}
		if err := checkTTLFlag(cliCtx); err != nil {
			return err
		}
		c, err := contractOf(cliCtx, nil)
		if err != nil {
			return err
		}
		req := vmfork.KeepRequest{Source: cliCtx.Args().Get(0), Name: cliCtx.Args().Get(1), Pool: cliCtx.Int("pool"), Contract: c}
		return run(cliCtx, func(v verb) error {
			return v.planOr(func() (*vmfork.Plan, error) { return v.mg.PlanKeep(v.ctx, req) }, func() error {
				t, err := v.mg.Keep(withProgress(v.ctx, cliCtx), req)
				if t == nil {
					return err
				}
				if _, terr := applyTTL(v.ctx, cliCtx, v.mg, req.Name); terr != nil {
					err = joinLine(err, terr)
				}
				return show(v, statusOf(v, t), err, func(s *vmfork.TemplateStatus) {
					fmt.Printf("kept %s as template %s (%s; source paused %.1f ms; pool %d of %d)\n",
						req.Source, s.Name, s.ID, s.PauseMS, s.Pooled, s.PoolSize)
				})
			})
		})
	},
}

// statusOf is template t as template ls shows it, or nil if it is gone.
func statusOf(v verb, t *vmfork.Template) *vmfork.TemplateStatus {
	st, _ := v.mg.Templates(v.ctx)
	for _, s := range st {
		if s.ID == t.ID {
			return &s
		}
	}
	return nil
}

var templateLsCommand = &cli.Command{
	Name:  "ls",
	Usage: "list templates: kept ones, and live forks' that children still map",
	Description: `For each template: its name if kept, its id, source, guest RAM size, the RAM
its frozen file holds, how many running children map it, and its warm pool
(live processes / size).`,
	Flags: []cli.Flag{jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		return run(cliCtx, func(v verb) error {
			ts, err := v.mg.Templates(v.ctx)
			if err != nil {
				return err
			}
			return v.print(ts, func() { printTemplates(os.Stdout, ts) })
		})
	},
}

// printTemplates is the table of template ls and checkpoint ls: a
// checkpoint is a kept template, so both list the same rows.
func printTemplates(w io.Writer, ts []vmfork.TemplateStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tSOURCE\tMEMORY\tRAM HELD\tCHILDREN\tPOOL\tCREATED")
	for _, t := range ts {
		held := "-"
		switch {
		case t.RAMLost:
			held = "lost" // a host restart took it (vmfork gc gives the name up)
		case t.HasMemory:
			held = fmt.Sprintf("%.1f MiB", float64(t.RAMBytes)/(1<<20))
			if t.RAMDelta {
				held += " delta" // on another template's file
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d MiB\t%s\t%d\t%d/%d\t%s\n", orDash(t.Name), t.ID, t.Source, t.MemoryMiB,
			held, t.Children, t.Pooled, t.PoolSize, t.Created.Local().Format("2006-01-02 15:04:05"))
	}
	return tw.Flush()
}

var templatePoolCommand = &cli.Command{
	Name:      "pool",
	Usage:     "set how many processes kept template NAME keeps started ahead",
	ArgsUsage: "NAME SIZE",
	Description: `Starts or stops processes so that SIZE of them wait for forks from kept
template NAME (0 stops them all). Each holds some tens of MiB while it waits.

   vmfork template pool golden 8`,
	Flags: []cli.Flag{dryRunFlag, jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 2 {
			return usageError{errors.New("template pool needs a template and a size: vmfork template pool NAME SIZE")}
		}
		name := cliCtx.Args().Get(0)
		size, err := strconv.Atoi(cliCtx.Args().Get(1))
		if err != nil {
			return usageError{fmt.Errorf("pool size %q is not a number", cliCtx.Args().Get(1))}
		}
		return run(cliCtx, func(v verb) error {
			return v.planOr(func() (*vmfork.Plan, error) { return v.mg.PlanPool(v.ctx, name, size) }, func() error {
				st, err := v.mg.SetPool(v.ctx, name, size)
				return show(v, st, err, func(st *vmfork.TemplateStatus) {
					fmt.Printf("template %s: pool %d of %d\n", st.Name, st.Pooled, st.PoolSize)
				})
			})
		})
	},
}

var templateRmCommand = &cli.Command{
	Name:      "rm",
	Usage:     "give up kept template NAME; its memory goes once no child maps it",
	ArgsUsage: "NAME",
	Description: `Stops NAME's warm pool and gives the name up: no new child can be forked from
it. Its children run on; its RAM, device state and frozen disk are removed
once no child maps its RAM and no other disk builds on its frozen disk.`,
	Flags: []cli.Flag{dryRunFlag, jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{errors.New("template rm needs a template name: vmfork template rm NAME")}
		}
		name := cliCtx.Args().First()
		return run(cliCtx, func(v verb) error {
			return v.planOr(func() (*vmfork.Plan, error) { return v.mg.PlanUnkeep(v.ctx, name) }, func() error {
				gone, err := v.mg.Unkeep(v.ctx, name)
				if err != nil {
					return err
				}
				res := struct {
					Name    string `json:"name"`
					Removed bool   `json:"removed"`
				}{name, gone}
				return v.print(res, func() {
					if gone {
						fmt.Printf("removed template %s\n", name)
					} else {
						fmt.Printf("template %s is no longer kept; its files go once no child maps its RAM and no disk builds on its own\n", name)
					}
				})
			})
		})
	},
}
