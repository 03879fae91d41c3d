package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"
)

var extendCommand = &cli.Command{
	Name:      "extend",
	Usage:     "move a machine's or kept template's TTL deadline",
	ArgsUsage: "NAME...",
	Description: `Sets the deadline of each machine or kept template NAME to --ttl from now;
--ttl 0 removes the deadline. The reaper reads the new deadline on its next
round.

   vmfork extend web-try-2 --ttl 1h`,
	Flags: []cli.Flag{
		&cli.DurationFlag{Name: "ttl", Usage: "new deadline, from now (0: none); required"},
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() == 0 {
			return usageError{errors.New("extend needs a machine or template name: vmfork extend NAME --ttl DURATION")}
		}
		if !cliCtx.IsSet("ttl") {
			return usageError{errors.New("extend needs --ttl DURATION (0 removes the deadline)")}
		}
		if err := checkTTLFlag(cliCtx); err != nil {
			return err
		}
		return run(cliCtx, func(v verb) error {
			type extended struct {
				Name    string    `json:"name"`
				Expires time.Time `json:"expires,omitzero"`
			}
			out := []extended{}
			var errs []error
			for _, name := range cliCtx.Args().Slice() {
				d, err := v.mg.SetTTL(v.ctx, name, cliCtx.Duration("ttl"))
				if err != nil {
					errs = append(errs, err)
					continue
				}
				out = append(out, extended{name, d})
				if cliCtx.Bool("json") {
					continue
				}
				if d.IsZero() {
					fmt.Printf("%s has no deadline\n", name)
				} else {
					fmt.Printf("%s expires %s\n", name, d.Local().Format(time.DateTime))
				}
			}
			if cliCtx.Bool("json") {
				if err := printJSON(out); err != nil {
					return err
				}
			}
			return joinErrors(errs)
		})
	},
}
