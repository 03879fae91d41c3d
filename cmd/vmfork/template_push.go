package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

// Flags that push and pull share.
var transferFlags = []cli.Flag{
	&cli.StringFlag{
		Name:    "ssh",
		Usage:   `the ssh command and its options, split on spaces as rsync's -e is (e.g. "ssh -F ./ssh_config -p 2222")`,
		Value:   "ssh",
		EnvVars: []string{"VMFORK_SSH"},
	},
	&cli.StringFlag{
		Name:    "remote-vmfork",
		Usage:   "the command that runs vmfork on HOST, as its shell reads it",
		Value:   "vmfork",
		EnvVars: []string{"VMFORK_REMOTE"},
	},
	&cli.DurationFlag{Name: "idle-timeout", Usage: "give up when HOST sends nothing (not even a keepalive) for this long; vmfork's --timeout bounds the whole transfer", Value: vmfork.DefaultTransferIdle},
	jsonFlag,
	// Last: fork --to takes transferFlags[0:3] by place.
	&cli.BoolFlag{Name: "no-compress", Usage: "send chunks raw: by default a chunk travels zstd-compressed when that saves space and the other host's vmfork takes it (an older one gets raw chunks)"},
}

func transferRequest(cliCtx *cli.Context, name string, r vmfork.Remote, what string) vmfork.TransferRequest {
	return vmfork.TransferRequest{
		Name: name, Remote: r, SSH: cliCtx.String("ssh"), RemoteVmfork: cliCtx.String("remote-vmfork"),
		Idle: cliCtx.Duration("idle-timeout"), Progress: byteProgress(what), NoCompress: cliCtx.Bool("no-compress"),
	}
}

func checkTransferFlags(cliCtx *cli.Context) error {
	if d := cliCtx.Duration("idle-timeout"); d <= 0 {
		return usageError{fmt.Errorf("--idle-timeout %v: must be above 0 (the whole transfer is bounded by vmfork --timeout)", d)}
	}
	return nil
}

func printTransfer(res *vmfork.TransferResult) {
	r := res.Received
	base := ""
	if r.Base != "" {
		base = ", diffed against " + r.Base
	}
	if res.Codec != "" {
		base += ", " + res.Codec + " where it paid"
	}
	fmt.Printf("%s: template %s kept as %s (%s) on the receiving host: %d of %d chunks sent%s; %.1f MiB out, %.1f MiB in, of %.1f MiB stored, in %.0f ms\n",
		res.Op, res.Name, r.Name, r.ID, r.ChunksSent, r.Chunks, base, mib(res.BytesOut), mib(res.BytesIn), mib(r.Stored), res.Elapsed)
}

var templatePushCommand = &cli.Command{
	Name:      "push",
	Usage:     "send template NAME to another host over SSH, only the chunks it lacks",
	ArgsUsage: "NAME [USER@]HOST[:NAME]",
	Description: `Sends kept template NAME to HOST, kept there as NAME (or the name after the
colon). Runs ssh HOST "vmfork template serve" (--ssh, --remote-vmfork).

The template's files (RAM, device state, disk chains flattened, kernel,
initrd) are cut into 2 MiB chunks named by their sha256, kept in this host's
chunk store (<state-dir>/chunks). HOST first gets the manifest and checks it
as "template import" does (driver, QEMU version, machine type, CPU model and
flags, RAM size, devices): a mismatch is refused naming the field, before
any chunk travels. HOST then asks only for the chunks it lacks, and for each
sends the page hashes of its own chunk at the same place in its closest
template, so only the 4 KiB pages that differ travel, each chunk's pages
zstd-compressed when that pays (--no-compress: raw; a HOST whose vmfork
predates compression gets raw chunks). HOST checks every
chunk's sha256 on arrival (a bad one is refused, naming it) and the template
appears there only once complete. Progress goes to stderr.

   vmfork template push golden-v2 root@host2
   vmfork template push golden-v2 host2:golden --ssh "ssh -p 2222" --json`,
	Flags: transferFlags,
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 2 {
			return usageError{errors.New("template push needs a template and a host: vmfork template push NAME [USER@]HOST[:NAME]")}
		}
		if err := checkTransferFlags(cliCtx); err != nil {
			return err
		}
		r, err := vmfork.ParseRemote(cliCtx.Args().Get(1), false)
		if err != nil {
			return err
		}
		return run(cliCtx, func(v verb) error {
			res, err := v.mg.Push(v.ctx, transferRequest(cliCtx, cliCtx.Args().Get(0), r, "push"))
			return show(v, res, err, printTransfer)
		})
	},
}

var templatePullCommand = &cli.Command{
	Name:      "pull",
	Usage:     "fetch template NAME from another host over SSH, only the chunks this host lacks",
	ArgsUsage: "[USER@]HOST:NAME",
	Description: `Fetches kept template NAME from HOST and keeps it here as NAME (or --as). The
manifest is checked against this host before any chunk is asked for; only
the chunks this host's store lacks travel, as the pages that differ from
its closest template's; every chunk's sha256 is checked on arrival. See
"template push".

   vmfork template pull root@host1:golden-v2
   vmfork fork golden-v2 --count 4`,
	Flags: append([]cli.Flag{&cli.StringFlag{Name: "as", Usage: "keep the template here under this name"}}, transferFlags...),
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{errors.New("template pull needs a host and a template: vmfork template pull [USER@]HOST:NAME")}
		}
		if err := checkTransferFlags(cliCtx); err != nil {
			return err
		}
		r, err := vmfork.ParseRemote(cliCtx.Args().First(), true)
		if err != nil {
			return err
		}
		if as := cliCtx.String("as"); as != "" {
			if err := vmfork.ValidateName(as); err != nil {
				return err
			}
		}
		return run(cliCtx, func(v verb) error {
			res, err := v.mg.Pull(v.ctx, transferRequest(cliCtx, cliCtx.String("as"), r, "pull"))
			return show(v, res, err, printTransfer)
		})
	},
}

// templateServeCommand is what push and pull run on the other host.
var templateServeCommand = &cli.Command{
	Name:   "serve",
	Usage:  "the other end of a push or pull, on stdin and stdout (run by ssh)",
	Hidden: true,
	Flags: []cli.Flag{
		&cli.DurationFlag{Name: "idle-timeout", Value: vmfork.DefaultTransferIdle},
	},
	Action: func(cliCtx *cli.Context) error {
		// A write to a session whose link died must fail, so that the
		// staged files are removed (receiveTemplate's abort), not kill
		// vmfork with SIGPIPE and leave them (TestForkTo found those).
		signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
		return run(cliCtx, func(v verb) error {
			return v.mg.Serve(v.ctx, os.Stdin, os.Stdout, cliCtx.Duration("idle-timeout"), func() {
				// Blocked on a read of stdin, which nothing can interrupt:
				// exit; a staged file is swept by the next transfer.
				fmt.Fprintf(os.Stderr, "vmfork template serve: nothing from the other host for %v: giving up\n", cliCtx.Duration("idle-timeout"))
				os.Exit(1)
			})
		})
	},
}
