package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var checkpointCommand = &cli.Command{
	Name:      "checkpoint",
	Usage:     "keep running machine NAME's instant as a template, to rewind to later",
	ArgsUsage: "NAME",
	Description: `Freezes NAME (a pause of a fraction of a second, as for a fork) into a kept
template named --as T, or NAME-cpN; NAME runs on. "vmfork rewind NAME --to T"
later puts NAME back to that instant; "vmfork fork T" makes children of it.
"checkpoint ls NAME" lists NAME's kept instants; "template rm T" gives one up.

   vmfork checkpoint agent --as before-step
   vmfork checkpoint ls agent
   vmfork rewind agent --to before-step`,
	Flags: []cli.Flag{&cli.StringFlag{Name: "as", Usage: "name the checkpoint `T`"}, contractFlag, dryRunFlag, jsonFlag},
	// "ls" is an argument, not a subcommand, so that flags may follow
	// NAME as on every other command (a machine named ls is checkpointed
	// by "vmfork checkpoint ls").
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() == 2 && cliCtx.Args().First() == "ls" {
			return listCheckpoints(cliCtx, cliCtx.Args().Get(1))
		}
		if cliCtx.NArg() != 1 {
			return usageError{errors.New("checkpoint needs a running machine: vmfork checkpoint NAME [--as T], or vmfork checkpoint ls NAME")}
		}
		c, err := contractOf(cliCtx, nil)
		if err != nil {
			return err
		}
		req := vmfork.CheckpointRequest{Machine: cliCtx.Args().First(), As: cliCtx.String("as"), Contract: c}
		return run(cliCtx, func(v verb) error {
			return v.planOr(func() (*vmfork.Plan, error) { return v.mg.PlanCheckpoint(v.ctx, req) }, func() error {
				t, err := v.mg.Checkpoint(v.ctx, req)
				if t == nil {
					return err
				}
				return show(v, statusOf(v, t), err, func(*vmfork.TemplateStatus) {
					fmt.Printf("checkpoint %s of %s (%s; paused %.1f ms)\n", t.Name, t.Source, t.ID, t.PauseMS)
				})
			})
		})
	},
}

// listCheckpoints prints machine's checkpoints (its kept instants), oldest
// first.
func listCheckpoints(cliCtx *cli.Context, machine string) error {
	return run(cliCtx, func(v verb) error {
		cps, err := v.mg.Checkpoints(v.ctx, machine)
		if err != nil {
			return err
		}
		return v.print(cps, func() { printTemplates(os.Stdout, cps) })
	})
}

var rewindCommand = &cli.Command{
	Name:      "rewind",
	Usage:     "put machine NAME back to the instant of checkpoint T",
	ArgsUsage: "NAME",
	Description: `Replaces NAME's running state (RAM, devices, disk) by checkpoint T's: NAME's
QEMU ends and a fork of T takes its place, with NAME's name, guest MAC, host
ports and lineage. Its identity is applied again (clock, vmgenid, MAC and
lease, hooks); the hostname, machine-id and SSH host keys are those of the
checkpoint, which are NAME's own. A checkpoint of another machine is refused
unless --force (NAME then gets its name as hostname, a fresh machine-id and
host keys). Everything is checked
before NAME's process ends; if the new one fails to come up, NAME is left
stopped on its disk from before.

   vmfork rewind agent --to before-step`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "to", Usage: "the checkpoint (kept template) `T`", Required: true},
		&cli.BoolFlag{Name: "force", Usage: "allow a checkpoint of another machine"},
		&cli.StringFlag{Name: "customize", Usage: "read the identity spec from `FILE` (YAML, or JSON if it ends in .json)"},
		&cli.StringSliceFlag{Name: "skip-step", Usage: "do not run the identity step `NAME`; repeatable"},
		dryRunFlag,
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{errors.New("rewind needs a machine: vmfork rewind NAME --to T")}
		}
		opts, err := identityOptions(cliCtx)
		if err != nil {
			return err
		}
		req := vmfork.RewindRequest{Machine: cliCtx.Args().First(), To: cliCtx.String("to"), Force: cliCtx.Bool("force"), Identity: opts}
		return run(cliCtx, func(v verb) error {
			return v.planOr(func() (*vmfork.Plan, error) { return v.mg.PlanRewind(v.ctx, req) }, func() error {
				res, err := v.mg.Rewind(v.ctx, req)
				return show(v, res, err, func(res *vmfork.ChildResult) {
					fmt.Printf("rewound %s to %s (pid %d)\n", res.Name, req.To, res.PID)
				})
			})
		})
	},
}
