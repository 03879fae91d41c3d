package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

var treeCommand = &cli.Command{
	Name:      "tree",
	Usage:     "show machines and templates as a lineage tree",
	ArgsUsage: "[NAME]",
	Description: `Shows every machine and template as a family tree: a machine's children are
the templates frozen from it, a template's children the machines forked from
it. A machine removed while a template of it lives on shows as "removed" in
its place. Each node shows its state, age, TTL left, and the RAM and disk it
holds on its own (a running machine: its private resident memory; a
template: its frozen RAM file; both: their own top disk image); the last
line says what sharing saves. With NAME, only NAME's family is shown.

   vmfork tree
   vmfork tree web --json`,
	Flags: []cli.Flag{jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() > 1 {
			return usageError{fmt.Errorf("tree takes at most one name, got %d", cliCtx.NArg())}
		}
		return run(cliCtx, func(v verb) error {
			tr, err := v.mg.Tree(v.ctx, cliCtx.Args().First())
			if err != nil {
				return err
			}
			if v.cli.Bool("json") {
				return printJSON(tr)
			}
			return tr.Render(os.Stdout)
		})
	},
}
