package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var hostCommand = &cli.Command{
	Name:  "host",
	Usage: "describe this host",
	Subcommands: []*cli.Command{{
		Name:  "info",
		Usage: "how much room this host has for new machines, and what it runs and holds",
		Description: `Prints what a placer needs to choose this host or another: the memory new
machines may take as admission counts it ((available - reserve) * overcommit,
--overcommit), the mem dir's and state dir's free space, CPU pressure, the
machines by state, and every template with the RAM it holds and how many more
children of it fit (by what its earlier children made private, or its guest's
RAM when none was measured). It changes nothing. The Ansible fleet pattern
reads it on every host:

   vmfork host info --json
   ssh host2 vmfork host info --json | jq .ram_for_new_bytes`,
		Flags: []cli.Flag{jsonFlag},
		Action: func(cliCtx *cli.Context) error {
			if cliCtx.NArg() != 0 {
				return usageError{fmt.Errorf("host info takes no arguments")}
			}
			return run(cliCtx, func(v verb) error {
				info, err := v.mg.HostInfo(v.ctx)
				return show(v, info, err, printHostInfo)
			})
		},
	}},
}

func printHostInfo(h *vmfork.HostInfo) {
	pressure := "n/a"
	if h.CPUPressure >= 0 {
		pressure = fmt.Sprintf("%.1f%%", h.CPUPressure)
	}
	fmt.Printf("host %s: driver %s, %d CPUs (pressure %s)\n", h.Hostname, h.Driver, h.CPUs, pressure)
	fmt.Printf("memory: %.0f MiB total, %.0f MiB available, %.0f MiB reserved; new machines may take %.0f MiB (overcommit %g)\n",
		mib(h.RAMTotalBytes), mib(h.RAMAvailableBytes), mib(h.RAMReserveBytes), mib(h.RAMForNewBytes), h.Overcommit)
	fmt.Printf("mem dir %s: %.0f MiB free; state dir %s: %.0f MiB free\n", h.MemDir, mib(h.MemDirFreeBytes), h.StateDir, mib(h.StateDirFreeBytes))
	fmt.Printf("machines: %d running, %d stopped, %d hibernated\n", h.Machines.Running, h.Machines.Stopped, h.Machines.Hibernated)
	fmt.Printf("templates: %d holding %.0f MiB of RAM\n", len(h.Templates), mib(h.TemplateRAMBytes))
	for _, t := range h.Templates {
		name := t.Name
		if name == "" {
			name = t.ID
		}
		fmt.Printf("  %s (of %s): %.0f MiB held, %d children; room for %d more at %.0f MiB each (%s)\n",
			name, t.Source, mib(t.RAMBytes), t.Children, t.ChildrenThatFit, mib(t.ChildRAMBytes), t.ChildRAMBasis)
	}
}
