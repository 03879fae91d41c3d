package main

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"
)

var diskCommand = &cli.Command{
	Name:  "disk",
	Usage: "work on a machine's disks",
	Description: `A disk on a block device (--disk id=data,file=/dev/vg0/data) is written in
place until the machine's first fork. The fork freezes the device where it
is: from then on it is the read-only base of the source's and the children's
qcow2 overlays in the state dir, and the source's new writes no longer land
on the device. "disk commit" puts them back once the children are gone.

   vmfork rm child1 child2
   vmfork stop db
   vmfork disk commit db --disk data
   vmfork start db`,
	Subcommands: []*cli.Command{diskCommitCommand},
}

var diskCommitCommand = &cli.Command{
	Name:      "commit",
	Usage:     "write a stopped machine's overlay on a block disk back onto the device",
	ArgsUsage: "MACHINE",
	Description: `Writes what MACHINE wrote since a fork froze its block-device disk (its
overlays in the state dir) onto the device with qemu-img commit, and puts the
machine back on the device, written in place, as it was before its first fork.
Without --disk, every disk of MACHINE on a block device.

The machine must be stopped (vmfork stop MACHINE; vmfork start it after): its
overlay must not change while it is copied (QMP block-commit on a running
machine is not used: docs/ARCHITECTURE.md, "Block-device disks", says why;
the price is a guest reboot). Refused in one line, exit 2,
while another machine or a template that is kept, hibernated or has children
still reads the device as its base: their view of it would change. Remove
them first (vmfork rm, vmfork template rm); a fork's own template goes with
its last child. A commit cut short (killed, a full device) is safe to run
again.

   vmfork disk commit db
   vmfork disk commit db --disk data --json`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "disk", Usage: "the disk's id (default: every disk on a block device)"},
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{errors.New("disk commit needs one machine: vmfork disk commit MACHINE [--disk ID]")}
		}
		name, id := cliCtx.Args().First(), cliCtx.String("disk")
		return run(cliCtx, func(v verb) error {
			res, err := v.mg.CommitDisk(v.ctx, name, id)
			if err != nil {
				return err
			}
			return v.print(res, func() {
				for _, c := range res {
					if len(c.Layers) == 0 {
						fmt.Printf("%s: disk %s: nothing to commit, the machine writes to %s in place\n", c.Machine, c.ID, c.Device)
						continue
					}
					fmt.Printf("%s: disk %s: committed %d overlay(s), %d bytes, onto %s in %d ms; the machine writes to it in place again\n",
						c.Machine, c.ID, len(c.Layers), c.Bytes, c.Device, c.MS)
				}
			})
		})
	},
}
