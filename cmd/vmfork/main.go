// Command vmfork forks running QEMU/KVM virtual machines.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

// Exit codes. Scripts branch on these; list them in --help.
const (
	exitFailure  = 1
	exitUsage    = 2
	exitPartial  = 3
	exitNotFound = 4
	exitNoRoom   = 5
)

const exitCodesHelp = `EXIT CODES:
   0  success
   1  failure
   2  bad input (usage, invalid name or value); nothing was changed
   3  partial success (a fork where only some children came up)
   4  no such machine or template
   5  refused by admission: the host lacks the memory, mem-dir space or disk
      the new machines would take (--overcommit); nothing was changed
   exec exits with the guest command's own exit code.`

// exitError carries an exit code chosen by a command (exec passes the guest
// command's code through).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit code %d", e.code) }

// usageError marks a command-line mistake.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	// Everything vmfork and the QEMUs it starts create — records, disks,
	// RAM files, QMP and agent sockets — is for root (or the user running
	// vmfork) alone. Files another user's QEMU must open (an adopted libvirt
	// domain's) are handed over explicitly by the libvirt driver.
	syscall.Umask(0o077)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	app := newApp()
	err := app.RunContext(ctx, normalizeArgs(app, os.Args))
	stop()
	os.Exit(exitCode(err))
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintf(os.Stderr, "vmfork: %v\n", err)
	var ue usageError
	var ec cli.ExitCoder
	switch {
	case errors.As(err, &ec) && strings.HasPrefix(err.Error(), "No help topic"):
		return exitUsage // `vmfork help nosuch`, from urfave's help command
	case errors.As(err, &ue), errors.Is(err, vmfork.ErrInvalid), errors.Is(err, vmfork.ErrExists):
		return exitUsage
	case errors.Is(err, vmfork.ErrPartial):
		return exitPartial
	case errors.Is(err, vmfork.ErrNotFound):
		return exitNotFound
	case errors.Is(err, vmfork.ErrNoRoom):
		return exitNoRoom
	}
	return exitFailure
}

func newApp() *cli.App {
	app := &cli.App{
		Name:  "vmfork",
		Usage: "fork(2) for full QEMU/KVM virtual machines",
		Description: `vmfork boots a VM once and then forks it: one call turns a running VM into
N running VMs that continue from the same instant, sharing memory and disk
copy-on-write.

   vmfork boot web --kernel vmlinuz --initrd initrd.gz --disk data.qcow2
   vmfork exec web -- uname -r
   vmfork ls
   vmfork rm web

QEMU processes outlive the command that started them. State lives in the
state dir (machine records, disks, sockets, logs) and guest RAM in the mem dir
(a tmpfs). Progress and logs go to stderr; with --json, stdout holds only JSON.`,
		CustomAppHelpTemplate: cli.AppHelpTemplate + "\n" + exitCodesHelp + "\n",
		Flags:                 globalFlags,
		Before:                setupLogging,
		Commands: []*cli.Command{
			bootCommand,
			forkCommand, forkServeCommand, checkpointCommand, rewindCommand, hibernateCommand, resumeCommand,
			contractCommand,
			templateCommand,
			lsCommand,
			execCommand,
			cpCommand,
			stopCommand, startCommand,
			diskCommand,
			rmCommand,
			logsCommand,
			libvirtCommand,
			exploreCommand,
			ledgerCommand,
			treeCommand,
			extendCommand,
			gcCommand,
			hostCommand,
			reaperCommand,
			brokerCommand,
			ledgerServerCommand,
			mcpCommand,
		},
		OnUsageError: onUsageError,
		ExitErrHandler: func(*cli.Context, error) {
			// main maps errors to exit codes; urfave must not exit itself.
		},
		// Without an Action, urfave answers an unknown command with its help
		// command's "No help topic" error, exit 1: bad input is exit 2.
		Action: func(cliCtx *cli.Context) error {
			if cliCtx.NArg() > 0 {
				return usageError{fmt.Errorf("unknown command %q: see vmfork --help", cliCtx.Args().First())}
			}
			return cli.ShowAppHelp(cliCtx)
		},
	}
	app.Commands = append(app.Commands, extraCommands...)
	markUsageErrors(app.Commands)
	return app
}

func onUsageError(_ *cli.Context, err error, _ bool) error { return usageError{err} }

// markUsageErrors makes a flag that does not parse (--count abc) a usage
// error, exit 2, in every command: urfave's OnUsageError is per command.
func markUsageErrors(cmds []*cli.Command) {
	for _, c := range cmds {
		if c.OnUsageError == nil {
			c.OnUsageError = onUsageError
		}
		if len(c.Subcommands) > 0 && c.Action == nil {
			c.Action = unknownSubcommand
		}
		markUsageErrors(c.Subcommands)
	}
}

// unknownSubcommand answers `vmfork template nosuch` (urfave would say "No
// help topic", exit 1) and shows the group's help when no subcommand is
// named.
func unknownSubcommand(cliCtx *cli.Context) error {
	if cliCtx.NArg() > 0 {
		return usageError{fmt.Errorf("unknown command %q for %q: see vmfork %s --help",
			cliCtx.Args().First(), cliCtx.Command.Name, cliCtx.Command.Name)}
	}
	return cli.ShowSubcommandHelp(cliCtx)
}
