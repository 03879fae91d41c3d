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
	Subcommands: []*cli.Command{templateSaveCommand, templateLsCommand, templatePoolCommand, templateRmCommand, templateExportCommand, templateImportCommand, templatePushCommand, templatePullCommand, templateServeCommand, templateCompactCommand},
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
its frozen file holds (for a delta: its own delta), its KIND (full: one file
its children share; delta/N: a base file plus N deltas that each child applies
and holds privately), the RAM it holds ALONE (what removing it would free now:
a delta that a later fork's chain links is held by both), how many running
children map it, and its warm pool (live processes / size). "vmfork template
compact NAME" makes a delta a full file.`,
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
	fmt.Fprintln(tw, "NAME\tID\tSOURCE\tMEMORY\tRAM HELD\tKIND\tALONE\tCHILDREN\tPOOL\tCREATED")
	for _, t := range ts {
		held, kind, alone := "-", "-", "-"
		if d := t.DeltaStats; d != nil && !t.RAMLost {
			kind = d.Kind
			if d.Depth > 0 {
				kind = fmt.Sprintf("delta/%d", d.Depth) // deltas a child applies
			}
			alone = fmt.Sprintf("%.1f MiB", float64(d.AloneBytes)/(1<<20))
		}
		switch {
		case t.RAMLost:
			held = "lost" // a host restart took it (vmfork gc gives the name up)
		case t.HasMemory:
			held = fmt.Sprintf("%.1f MiB", float64(t.RAMBytes)/(1<<20))
			if t.RAMDelta {
				held += " delta" // on another template's file
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d MiB\t%s\t%s\t%s\t%d\t%d/%d\t%s\n", orDash(t.Name), t.ID, t.Source, t.MemoryMiB,
			held, kind, alone, t.Children, t.Pooled, t.PoolSize, t.Created.Local().Format("2006-01-02 15:04:05"))
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

var templateCompactCommand = &cli.Command{
	Name:      "compact",
	Usage:     "make delta template NAME (kept name or id) one full RAM file",
	ArgsUsage: "NAME",
	Description: `A fork of a machine that already maps a frozen file (a source forked before,
or a child) makes a delta template: the frozen file plus the pages changed
since, as a chain of deltas (template ls: KIND delta/N). Each child of it
applies the chain and holds those pages privately. compact writes the base
with the chain over it into one file, outside any pause, under a temporary
name renamed when whole, and then switches the template to it under its
lock: the children made after share that file and apply nothing. Children
already running keep what they map. It costs the used RAM once more in the
mem dir while the base is held by others (the source, older templates).

vmfork fork decides by itself for a burst (--count N: a full file when N
children would together hold more than it), and export and push compact
first. Use compact for a delta template that will serve many children
later, or before reading its RAM with other tools.

   vmfork template compact web.7
   vmfork template ls`,
	Flags: []cli.Flag{jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{errors.New("template compact needs a template: vmfork template compact NAME")}
		}
		name := cliCtx.Args().First()
		return run(cliCtx, func(v verb) error {
			res, err := v.mg.CompactTemplate(v.ctx, name)
			if err != nil {
				return err
			}
			return v.print(res, func() {
				if !res.Compacted {
					fmt.Printf("template %s is a full file already\n", res.Template)
					return
				}
				fmt.Printf("compacted template %s (%d deltas) into a full file: %.1f MiB written in %.0f ms\n",
					res.Template, res.Depth, float64(res.WrittenBytes)/(1<<20), res.ElapsedMS)
			})
		})
	},
}
