package main

import (
	"context"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

// verb is what a command's action works with once its arguments have
// passed its usage checks: the command's context (--timeout applied once,
// appContext) and its Manager (newManager).
type verb struct {
	cli *cli.Context
	ctx context.Context
	mg  *vmfork.Manager
}

// run is the preamble every command shares: it derives the context, opens
// the store and wires the driver, then calls fn. Usage checks come before
// it, so that a bad command line changes nothing, not even the state dir.
func run(cliCtx *cli.Context, fn func(v verb) error) error {
	ctx, cancel := appContext(cliCtx)
	defer cancel()
	mg, err := newManager(cliCtx)
	if err != nil {
		return err
	}
	return fn(verb{cli: cliCtx, ctx: ctx, mg: mg})
}

// planOr is a command that takes --dry-run: with it, plan's plan is
// printed (printPlan) and nothing else runs; without it, apply runs.
func (v verb) planOr(plan func() (*vmfork.Plan, error), apply func() error) error {
	if !v.cli.Bool("dry-run") {
		return apply()
	}
	p, err := plan()
	if err != nil {
		return err
	}
	return printPlan(v.cli, p)
}

// print prints res: one JSON document with --json, else text.
func (v verb) print(res any, text func()) error {
	if v.cli.Bool("json") {
		return printJSON(res)
	}
	text()
	return nil
}

// show prints a result that may come with an error (a fork of which only
// some children came up: exit 3) and returns that error; with no result it
// returns the error alone.
func show[T any](v verb, res *T, err error, text func(*T)) error {
	if res == nil {
		return err
	}
	if perr := v.print(res, func() { text(res) }); perr != nil {
		return perr
	}
	return err
}
