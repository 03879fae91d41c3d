package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var rmCommand = &cli.Command{
	Name:      "rm",
	Aliases:   []string{"remove"},
	Usage:     "kill machines and delete them with all their files",
	ArgsUsage: "NAME...",
	Description: `Kills each machine's QEMU if it runs (its disk is deleted too, so there is
nothing to shut down cleanly) and deletes its record, disk overlay, sockets,
logs and RAM file. A template whose last child goes is removed as well. With
--force a machine is removed even when its process cannot be stopped.`,
	Flags: []cli.Flag{
		&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "remove even if the process cannot be stopped"},
		dryRunFlag,
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() == 0 {
			return usageError{fmt.Errorf("rm needs at least one machine name")}
		}
		names, force := cliCtx.Args().Slice(), cliCtx.Bool("force")
		return run(cliCtx, func(v verb) error {
			if v.cli.Bool("dry-run") {
				p, perrs := v.mg.PlanRemove(v.ctx, names, force)
				if err := printPlan(cliCtx, p); err != nil {
					return err
				}
				var errs []error
				for i, err := range perrs {
					if err != nil {
						errs = append(errs, keptHint(v.mg, names[i], err))
					}
				}
				return joinErrors(errs)
			}
			return remove(v, names, force)
		})
	},
}

// remove removes names, each tried; the first error decides the exit code.
func remove(v verb, names []string, force bool) error {
	removed, forgotten := []string{}, []string{}
	var errs []error
	for _, name := range names {
		// An adopted machine (a libvirt domain vmfork did not make) is
		// only forgotten: it keeps running, as its owner's.
		m, _ := v.mg.Store.LoadMachine(name)
		adopted := m != nil && m.Adopted != nil
		if err := v.mg.Remove(v.ctx, name, force); err != nil {
			errs = append(errs, keptHint(v.mg, name, err))
			continue
		}
		removed = append(removed, name)
		if adopted {
			forgotten = append(forgotten, name)
		}
		switch {
		case v.cli.Bool("json"):
		case adopted:
			fmt.Printf("%s forgotten (it runs on; vmfork no longer manages it)\n", name)
		default:
			fmt.Printf("%s removed\n", name)
		}
	}
	if v.cli.Bool("json") {
		// "removed" lists every name done; "forgotten" those of them
		// that were only forgotten.
		if err := printJSON(map[string]any{"removed": removed, "forgotten": forgotten}); err != nil {
			return err
		}
	}
	return joinErrors(errs)
}

// keptHint points at template rm when name, not found as a machine, is a
// kept template.
func keptHint(mg *vmfork.Manager, name string, err error) error {
	if t, terr := mg.Store.FindKept(name); errors.Is(err, vmfork.ErrNotFound) && terr == nil {
		return fmt.Errorf("%w; %s is a kept template (%s): vmfork template rm %s", err, name, t.ID, name)
	}
	return err
}

// joinErrors joins errors into one whose message stays on one line and which
// still matches each of them with errors.Is; the first one leads.
func joinErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return fmt.Errorf("%w (and: %s)", errs[0], strings.Join(msgs[1:], "; "))
}
