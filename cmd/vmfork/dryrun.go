package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

// dryRunFlag is shared by the commands that change something. A dry run
// checks the request exactly as the real run does (same errors, same exit
// codes) and says what would happen; it changes nothing. The Ansible
// modules run it for check mode.
var dryRunFlag = &cli.BoolFlag{Name: "dry-run", Usage: "check everything and say what would happen; change nothing"}

// printPlan prints a dry run's plan: one JSON document, or one line per action.
func printPlan(cliCtx *cli.Context, p *vmfork.Plan) error {
	if cliCtx.Bool("json") {
		return printJSON(p)
	}
	if len(p.Actions) == 0 {
		fmt.Println("dry run: nothing would change")
	}
	for _, a := range p.Actions {
		fmt.Printf("would %s\n", a)
	}
	return nil
}
