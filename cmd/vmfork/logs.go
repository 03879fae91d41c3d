package main

import (
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"
)

var logsCommand = &cli.Command{
	Name:      "logs",
	Usage:     "print a machine's serial console log",
	ArgsUsage: "NAME",
	Description: `Prints what the guest wrote to its serial console (ttyS0). With --qemu, prints
QEMU's own log instead: its command line and its error messages.`,
	Flags: []cli.Flag{
		&cli.BoolFlag{Name: "qemu", Usage: "print QEMU's log instead of the guest console"},
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{fmt.Errorf("logs takes exactly one machine name")}
		}
		return run(cliCtx, func(v verb) error {
			m, err := v.mg.Get(v.ctx, cliCtx.Args().First())
			if err != nil {
				return fmt.Errorf("logs: %w", err)
			}
			path := m.Paths.Serial
			if cliCtx.Bool("qemu") {
				path = m.Paths.Log
			}
			f, err := os.Open(path)
			if err != nil {
				return fmt.Errorf("logs %q: %w", m.Name, err)
			}
			defer f.Close()
			if cliCtx.Bool("json") {
				data, err := io.ReadAll(f)
				if err != nil {
					return fmt.Errorf("logs %q: %w", m.Name, err)
				}
				return printJSON(map[string]string{"name": m.Name, "path": path, "log": string(data)})
			}
			_, err = io.Copy(os.Stdout, f)
			return err
		})
	},
}
