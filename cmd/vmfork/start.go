package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var startCommand = &cli.Command{
	Name:      "start",
	Usage:     "boot stopped machines again from their own disks",
	ArgsUsage: "NAME...",
	Description: `Boots each stopped machine again from its own disk, as the same machine:
its name, MAC, host ports, network, vmgenid and contract stay, and no
identity chain runs (a fork makes a new machine; start does not). A fork
child gets a RAM file of its own, so it starts also after a host restart
took its template's RAM, and its recorded hostname and machine-id are put
back where its guest booted without them. It returns once the guest agent
answers (--timeout bounds the wait). If a machine fails to come up it stays
stopped; the error says why. A hibernated machine is resumed (vmfork
resume), not started.

   vmfork stop web
   vmfork start web
   vmfork start --json web db`,
	Flags: []cli.Flag{dryRunFlag, jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() == 0 {
			return usageError{fmt.Errorf("start needs at least one stopped machine: vmfork start NAME...")}
		}
		names := cliCtx.Args().Slice()
		return run(cliCtx, func(v verb) error {
			if v.cli.Bool("dry-run") {
				p, errs := v.mg.PlanStart(v.ctx, names)
				if err := printPlan(cliCtx, p); err != nil {
					return err
				}
				return joinErrors(errs)
			}
			var results []*vmfork.StartResult
			for _, name := range names {
				res, err := v.mg.Start(v.ctx, name)
				if err != nil {
					return err
				}
				results = append(results, res)
				if !cliCtx.Bool("json") {
					restored := ""
					if len(res.Restored) > 0 {
						restored = "; put back its " + strings.Join(res.Restored, " and ")
					}
					fmt.Printf("started %s (pid %d; ready in %.0f ms%s)\n", res.Name, res.PID, res.ReadyMS, restored)
				}
			}
			if cliCtx.Bool("json") {
				return printJSON(results)
			}
			return nil
		})
	},
}
