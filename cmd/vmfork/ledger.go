package main

import (
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/ledger"
)

// ledgerCommand shows a family's ledger and lets an operator release a
// claim (docs/LEDGER.md).
var ledgerCommand = &cli.Command{
	Name:      "ledger",
	Usage:     "list the family ledger of a machine's family, or release a claim",
	ArgsUsage: "NAME",
	Description: `Lists the records of the family ledger of NAME's family (NAME is a machine
or a kept template): the keys a program in any machine of the family claimed
before an external effect, who holds each, and whether it was done. A family
is a root machine and everything made from it: children, checkpoints,
rewinds, explore branches. In a guest the ledger is the virtio-serial port
/dev/virtio-ports/org.vmfork.ledger.0, and vmfork-ledger (ledger/vmfork-ledger
in vmfork's repository) speaks to it:

   # in the guest: claim, do the effect, report it done
   if vmfork-ledger claim pay-42; then
       receipt=$(charge-card 42) && vmfork-ledger done pay-42 "$receipt"
   fi

   # on the host
   vmfork ledger web                       # KEY STATE HOLDER CLAIMED RESULT
   vmfork ledger web --json                # a JSON array of records
   vmfork ledger web --release pay-42      # its holder died: let another claim it
   vmfork ledger web --release pay-42 --dry-run

Only the holder's own machine, or an operator here, can release a claim;
releasing a done key lets its effect be done again: the operator's call.
Exit 4: no machine or kept template NAME, or no claim of KEY to release.`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "release", Usage: "release the claim of `KEY`, whoever holds it"},
		dryRunFlag,
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{fmt.Errorf("ledger takes one machine name, got %d", cliCtx.NArg())}
		}
		key := cliCtx.String("release")
		if cliCtx.IsSet("release") {
			if err := ledger.CheckKey(key); err != nil {
				return usageError{fmt.Errorf("--release: %v", err)}
			}
		} else if cliCtx.Bool("dry-run") {
			return usageError{fmt.Errorf("--dry-run goes with --release: a listing changes nothing")}
		}
		name := cliCtx.Args().First()
		return run(cliCtx, func(v verb) error {
			family, err := v.mg.FamilyOf(name)
			if err != nil {
				return err
			}
			c, err := ledgerClient(cliCtx)
			if err != nil {
				return err
			}
			if key != "" {
				return ledgerRelease(v, c, name, family, key)
			}
			recs, err := c.List(v.ctx, family)
			if err != nil {
				return fmt.Errorf("ledger of %q: %w", name, err)
			}
			return v.print(recs, func() { printRecords(recs) })
		})
	},
}

// ledgerRelease releases key in family (or, with --dry-run, says what it
// would release) and prints the released record.
func ledgerRelease(v verb, c *ledger.Client, name, family, key string) error {
	notClaimed := func() error {
		return fmt.Errorf("ledger of %q: %s is not claimed: %w", name, key, vmfork.ErrNotFound)
	}
	if v.cli.Bool("dry-run") {
		r, err := c.Get(v.ctx, family, key)
		if errors.Is(err, ledger.ErrNotFound) || err == nil && (r.Key == "" || r.State == ledger.Released) {
			return notClaimed()
		}
		if err != nil {
			return fmt.Errorf("ledger of %q: %w", name, err)
		}
		p := &vmfork.Plan{DryRun: true, Command: "ledger release", Changed: true, Machines: []string{r.Holder},
			Actions: []string{fmt.Sprintf("release %s, %s by %s at %s", key, r.State, r.Holder, r.ClaimedAt.Format(ledger.TimeFormat))}}
		return printPlan(v.cli, p)
	}
	r, err := c.Release(v.ctx, family, key)
	if errors.Is(err, ledger.ErrNotClaimed) || errors.Is(err, ledger.ErrNotFound) {
		return notClaimed()
	}
	if err != nil {
		return fmt.Errorf("ledger of %q: release %s: %w", name, key, err)
	}
	return v.print(r, func() {
		fmt.Printf("released %s (was held by %s since %s)\n", r.Key, r.Holder, r.ClaimedAt.Format(ledger.TimeFormat))
	})
}

// printRecords prints a family's records as a table.
func printRecords(recs []ledger.Record) {
	if len(recs) == 0 {
		fmt.Println("no records")
		return
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tHOLDER\tCLAIMED\tRESULT")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Key, r.State, r.Holder, ago(r.ClaimedAt), r.Result)
	}
	tw.Flush()
}

// ago is how long before now t was, as a table shows it.
func ago(t time.Time) string {
	return time.Since(t).Round(time.Second).String() + " ago"
}
