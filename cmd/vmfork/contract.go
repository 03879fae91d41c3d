package main

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/contract"
)

// contractFlag is taken by every command that makes machines or templates.
var contractFlag = &cli.StringFlag{
	Name:  "contract",
	Usage: "the fork contract from `FILE` (YAML, or JSON if it ends in .json): egress, DNS, inherited connections, brokered secrets",
}

// contractOf returns the contract --contract names, else fromSpec (a
// --customize spec's contract: section). A bad file is a usage error that
// names the field.
func contractOf(cliCtx *cli.Context, fromSpec *contract.Contract) (*contract.Contract, error) {
	f := cliCtx.String("contract")
	if f == "" {
		return fromSpec, nil
	}
	c, err := contract.Load(absPath(f))
	if err != nil {
		return nil, usageError{fmt.Errorf("--contract: %w", err)}
	}
	return c, nil
}

var contractCommand = &cli.Command{
	Name:      "contract",
	Usage:     "show machine NAME's fork contract and the host rules enforcing it, or change it",
	ArgsUsage: "NAME",
	Description: `A machine's contract says what it may reach and hold, enforced by the host
where the guest cannot undo it: egress (all, none, or an allow list of
HOST:PORT, CIDR:PORT and CIDR), DNS (host or none), what becomes of the TCP
connections a child inherits (reset or keep), and secrets the guest never
holds (a placeholder in the guest; the host adds each child's own value to
its requests to the secret's hosts). Children inherit their parent's contract
unless their fork names another (fork --contract FILE). See docs/SECURITY.md.

--set FILE replaces a running machine's contract: its host rules change in
place, at once. Only the network part can change; the secrets' placeholders
are in the guest already.

   vmfork contract web-1
   vmfork contract web-1 --set no-egress.yaml`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "set", Usage: "replace running NAME's contract by the one in `FILE`"},
		dryRunFlag,
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{errors.New("contract needs one machine: vmfork contract NAME [--set FILE]")}
		}
		name := cliCtx.Args().First()
		var set *contract.Contract
		if f := cliCtx.String("set"); f != "" {
			c, err := contract.Load(absPath(f))
			if err != nil {
				return usageError{fmt.Errorf("--set: %w", err)}
			}
			set = c
		} else if cliCtx.Bool("dry-run") {
			return usageError{errors.New("--dry-run goes with --set: showing a contract changes nothing")}
		}
		return run(cliCtx, func(v verb) error {
			if set == nil {
				st, err := v.mg.Contract(v.ctx, name)
				return show(v, st, err, printContract)
			}
			return v.planOr(func() (*vmfork.Plan, error) { return v.mg.PlanSetContract(v.ctx, name, set) }, func() error {
				st, err := v.mg.SetContract(v.ctx, name, set)
				return show(v, st, err, printContract)
			})
		})
	},
}

func printContract(st *vmfork.ContractStatus) {
	fmt.Printf("%s (%s)\n", st.Name, st.State)
	c := st.Contract
	if !c.Enforced() {
		fmt.Println("contract: none (it reaches what its network reaches)")
	} else {
		n := c.NetworkOf()
		egress := string(n.Egress.Mode)
		if n.Egress.Mode == contract.EgressAllow {
			var d []string
			for _, a := range n.Egress.Allow {
				d = append(d, a.String())
			}
			egress = "allow " + strings.Join(d, ", ")
		}
		fmt.Printf("egress:      %s\ndns:         %s\nconnections: %s\n", egress, n.DNS, n.Connections)
		for _, s := range c.SecretNames() {
			fmt.Printf("secret:      %s for %s (header %s)\n", s, strings.Join(c.Secrets[s].Hosts, ", "), c.Secrets[s].Header)
		}
		if f := c.SecretFiles; f != nil {
			for _, p := range f.Wipe {
				fmt.Printf("wipe:        %s\n", p)
			}
			for _, p := range slices.Sorted(maps.Keys(f.Rotate)) {
				fmt.Printf("rotate:      %s\n", p)
			}
		}
	}
	if len(st.Rules) > 0 {
		fmt.Println("host rules:")
		for _, r := range st.Rules {
			fmt.Printf("  %s\n", r)
		}
	}
}
