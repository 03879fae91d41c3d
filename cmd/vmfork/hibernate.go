package main

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var hibernateCommand = &cli.Command{
	Name:      "hibernate",
	Usage:     "freeze running machine NAME to disk and end its QEMU",
	ArgsUsage: "NAME",
	Description: `Freezes NAME (a pause of a fraction of a second, as for a fork) into a
template of its own, writes its RAM sparse under the state dir and ends its
QEMU: the host gets the memory back (the mem dir's tmpfs shrinks by NAME's
RAM). "vmfork ls" shows it hibernated. "vmfork resume NAME" continues it where
it was; "vmfork fork NAME" makes running children of that instant and leaves
NAME hibernated; "vmfork rm NAME" removes it with its files. Until the RAM
is on disk any failure leaves NAME running.

   vmfork hibernate agent
   vmfork resume agent`,
	Flags: []cli.Flag{dryRunFlag, jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{errors.New("hibernate needs a running machine: vmfork hibernate NAME")}
		}
		name := cliCtx.Args().First()
		return run(cliCtx, func(v verb) error {
			return v.planOr(func() (*vmfork.Plan, error) { return v.mg.PlanHibernate(v.ctx, name) }, func() error {
				res, err := v.mg.Hibernate(v.ctx, name)
				return show(v, res, err, func(res *vmfork.HibernateResult) {
					fmt.Printf("hibernated %s (%s; paused %.1f ms; %d MiB of RAM stored as %d MiB in %s)\n",
						res.Name, res.Template, res.PauseMS, res.RAMSizeBytes>>20, res.RAMBytes>>20, res.RAMFile)
				})
			})
		})
	},
}

var resumeCommand = &cli.Command{
	Name:      "resume",
	Usage:     "continue hibernated machine NAME where it was",
	ArgsUsage: "NAME",
	Description: `Brings NAME's RAM back from disk and starts it from the instant it was
hibernated, in place: same name, guest MAC, host ports, hostname, machine-id
and host keys (its identity chain does not run again). Its clock is stepped
to the host's, as it stood still while NAME slept. If the new process fails
to come up, NAME stays hibernated.

   vmfork resume agent`,
	Flags: []cli.Flag{dryRunFlag, jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{errors.New("resume needs a hibernated machine: vmfork resume NAME")}
		}
		req := vmfork.ResumeRequest{Machine: cliCtx.Args().First()}
		return run(cliCtx, func(v verb) error {
			return v.planOr(func() (*vmfork.Plan, error) { return v.mg.PlanResume(v.ctx, req) }, func() error {
				res, err := v.mg.Resume(v.ctx, req)
				return show(v, res, err, func(res *vmfork.ChildResult) {
					fmt.Printf("resumed %s (pid %d; ready in %.0f ms)\n", res.Name, res.PID, res.ReadyMS)
				})
			})
		})
	},
}
