package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

var stopCommand = &cli.Command{
	Name:      "stop",
	Usage:     "shut machines down, keeping their disks",
	ArgsUsage: "NAME...",
	Description: `Presses the ACPI power button, waits a little for the guest to power off, then
makes QEMU quit, then kills it. With --force it kills QEMU at once. The
machine's record and disk stay; its RAM file is released.`,
	Flags: []cli.Flag{
		&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "kill QEMU at once"},
		dryRunFlag,
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() == 0 {
			return usageError{fmt.Errorf("stop needs at least one machine name")}
		}
		names, force := cliCtx.Args().Slice(), cliCtx.Bool("force")
		return run(cliCtx, func(v verb) error {
			if v.cli.Bool("dry-run") {
				p, errs := v.mg.PlanStop(v.ctx, names, force)
				if err := printPlan(cliCtx, p); err != nil {
					return err
				}
				return joinErrors(errs)
			}
			var views []machineView
			for _, name := range names {
				m, err := v.mg.Stop(v.ctx, name, force)
				if err != nil {
					return err
				}
				views = append(views, viewOf(m))
				if !cliCtx.Bool("json") {
					fmt.Printf("%s stopped\n", name)
				}
			}
			if cliCtx.Bool("json") {
				return printJSON(views)
			}
			return nil
		})
	},
}
