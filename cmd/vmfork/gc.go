package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var gcCommand = &cli.Command{
	Name:  "gc",
	Usage: "remove now what is due: expired machines and templates, dead explores' branches, unused templates",
	Description: `Does on demand what the reaper does on its own: removes machines whose TTL
has passed, gives up kept templates whose TTL has passed (each goes once its
last child has gone), removes the branches of explores whose process died,
repairs forks a killed command left half-done, gives up kept templates whose
RAM a host restart took (they can never make a child again), removes
templates no machine needs, and removes the chunks (template push/pull) no
template's chunk map names. Machines without a TTL are never touched.

   vmfork gc --json`,
	Flags: []cli.Flag{jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 0 {
			return usageError{fmt.Errorf("gc takes no arguments")}
		}
		return run(cliCtx, func(v verb) error {
			res, err := v.mg.GC(v.ctx)
			return show(v, &res, err, func(res *vmfork.ReapResult) {
				fmt.Printf("removed %d machines (%s); released %d templates (%s); %d deadlines to come\n",
					len(res.Removed), orDash(strings.Join(res.Removed, ",")), len(res.Released), orDash(strings.Join(res.Released, ",")), res.Pending)
				if res.Chunks > 0 {
					fmt.Printf("removed %d chunks no template needs from the chunk store\n", res.Chunks)
				}
				if len(res.Lost) > 0 {
					fmt.Printf("gave up %d kept templates whose RAM a host restart took (%s)\n", len(res.Lost), strings.Join(res.Lost, ","))
				}
			})
		})
	},
}
