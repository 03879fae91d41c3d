package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

// fork --to HOST (forkto.go): the flags it adds to fork, and the hidden
// fork-serve that ssh runs on the other host.

var forkToFlags = []cli.Flag{
	&cli.StringFlag{Name: "to", Usage: "fork onto another host, `[USER@]HOST`, over SSH: the instant is frozen here, pushed (the chunks HOST lacks) and forked there (see FORK ONTO ANOTHER HOST)"},
	// --ssh, --remote-vmfork, --idle-timeout: push's (transferFlags, less --json).
	transferFlags[0], transferFlags[1], transferFlags[2],
	&cli.StringFlag{Name: "to-mode", Value: vmfork.ForkToAuto, Usage: "with --to: `auto`, copy or postcopy: how the instant travels (see FORK ONTO ANOTHER HOST)"},
	// Tests slow the live path's postcopy phase to cut the link inside it.
	&cli.Int64Flag{Name: "postcopy-bandwidth", Hidden: true, Usage: "with --to-mode postcopy: bound the migration to `BYTES`/s"},
	&cli.DurationFlag{Name: "postcopy-after", Hidden: true, Usage: "with --to-mode postcopy: switch to postcopy only after this long"},
}

// forkToForwarded are the fork flags a fork --to hands on to the other
// host's fork, where the children are made. The others are refused with
// --to: they name files on this host (--customize, --extra-step,
// --contract), or do what this path does not (--disk-only, --dry-run).
var forkToForwarded = []string{"count", "prefix", "parallel", "max-children", "identity", "hostname", "network",
	"address", "gateway", "dns", "skip-step", "step-timeout", "disk-policy", "on-identity-failure", "ttl"}

var forkToRefused = []string{"customize", "extra-step", "contract", "disk-only", "crash-consistent", "detach-devices", "dry-run", "trace-json"}

const forkToHelp = `

FORK ONTO ANOTHER HOST: --to [USER@]HOST makes the children on HOST, a host
that runs vmfork (--remote-vmfork) and that ssh reaches (--ssh). SOURCE's
instant is frozen here as for a local fork (the same pause; a kept template
is not touched), sent as "template push" does (only the chunks HOST lacks,
checked against HOST's QEMU first; see --to-mode for what is sent), and
forked there; each child's identity chain runs there. The children are machines of HOST: "ssh HOST
vmfork ls". If the link or either side dies before the fork is committed,
HOST removes what it made and nothing is left here but SOURCE, running.

--to-mode says how the instant travels. postcopy (the live path): only the
disk layers are pushed (usually a delta); a QEMU loaded from the instant
here migrates to the child's QEMU on HOST, postcopy, through the ssh
connection (a forwarded unix socket: no port is opened), so the child runs
before its RAM has arrived and pages it touches are fetched on demand. If
the link dies before the child's whole RAM is there, the child is lost:
HOST kills and removes it (SOURCE is never touched). copy: the template is
pushed whole (RAM included), then forked there: slower, but a cut link
costs nothing but a retry. auto (the default) takes postcopy for one child
of a source without extra disks, copy otherwise (several children, extra
disks). With --connect, HOST's vmfork must reach its libvirtd too (e.g.
LIBVIRT_DEFAULT_URI there): the child is a domain of HOST's libvirtd.

   vmfork fork web --to root@host2 --json
   vmfork fork golden -n 3 --to host2 --ssh "ssh -p 2222"`

func init() {
	// fork-serve takes what fork takes, less --to; fork learns --to.
	forkServeCommand.Flags = append(append([]cli.Flag{}, forkCommand.Flags...), transferFlags[2],
		&cli.StringFlag{Name: "incoming", Usage: "the live path's unix socket (forkto_live.go)"})
	forkCommand.Flags = append(forkCommand.Flags, forkToFlags...)
	forkCommand.Description += forkToHelp
}

// forkTo is fork --to HOST.
func forkTo(cliCtx *cli.Context) error {
	r, err := vmfork.ParseRemote(cliCtx.String("to"), false)
	if err != nil {
		return fmt.Errorf("--to: %w", err)
	}
	if r.Name != "" {
		return usageError{fmt.Errorf("--to %q: a fork goes to a host, [USER@]HOST, not HOST:NAME", cliCtx.String("to"))}
	}
	for _, f := range forkToRefused {
		if cliCtx.IsSet(f) {
			return usageError{fmt.Errorf("--%s cannot be used with --to (fork onto another host)", f)}
		}
	}
	if err := checkTransferFlags(cliCtx); err != nil {
		return err
	}
	// Every value checked here, before anything is paused, as a local
	// fork checks it; the other host checks them again.
	req, err := forkRequest(cliCtx)
	if err != nil {
		return err
	}
	for _, n := range req.Names {
		if err := vmfork.ValidateName(n); err != nil {
			return err
		}
	}
	mode := cliCtx.String("to-mode")
	switch mode {
	case vmfork.ForkToAuto, vmfork.ForkToCopy, vmfork.ForkToPostcopy:
	default:
		return usageError{fmt.Errorf("--to-mode %q is not auto, copy or postcopy", mode)}
	}
	if n := max(len(req.Names), cliCtx.Int("count")); mode == vmfork.ForkToPostcopy && n > 1 {
		return usageError{fmt.Errorf("--to-mode postcopy makes one child (one migration), not %d: use --to-mode copy", n)}
	}
	if bw := cliCtx.Int64("postcopy-bandwidth"); bw < 0 {
		return usageError{fmt.Errorf("--postcopy-bandwidth %d is negative", bw)}
	}
	if d := cliCtx.Duration("postcopy-after"); d < 0 {
		return usageError{fmt.Errorf("--postcopy-after %v is negative", d)}
	}
	var remoteArgs []string
	for _, f := range forkToForwarded {
		if !cliCtx.IsSet(f) {
			continue
		}
		switch f {
		case "address", "dns", "skip-step", "step-timeout", "disk-policy":
			for _, s := range cliCtx.StringSlice(f) {
				remoteArgs = append(remoteArgs, "--"+f+"="+s)
			}
		case "count", "parallel", "max-children":
			remoteArgs = append(remoteArgs, fmt.Sprintf("--%s=%d", f, cliCtx.Int(f)))
		case "ttl":
			remoteArgs = append(remoteArgs, "--ttl="+cliCtx.Duration(f).String())
		default:
			remoteArgs = append(remoteArgs, "--"+f+"="+cliCtx.String(f))
		}
	}
	return run(cliCtx, func(v verb) error {
		res, err := v.mg.ForkTo(withProgress(v.ctx, cliCtx), vmfork.ForkToRequest{
			Source:      req.Source,
			Transfer:    transferRequest(cliCtx, "", r, "push"),
			Identity:    req.Identity,
			RemoteFlags: remoteArgs,
			Names:       req.Names,
			Mode:        mode,

			Migrate: vmfork.MigrateOptions{MaxBandwidth: cliCtx.Int64("postcopy-bandwidth"), PrecopyFor: cliCtx.Duration("postcopy-after")},
		})
		return show(v, res, err, printForkTo)
	})
}

func printForkTo(res *vmfork.ForkToResult) {
	if res.PauseMS > 0 {
		fmt.Printf("forked %s onto %s (source paused %.1f ms); pushed %.1f MiB (%d of %d chunks) in %.0f ms\n",
			res.Source, res.Host, res.PauseMS, mib(res.Push.BytesOut), res.Push.Received.ChunksSent, res.Push.Received.Chunks, res.PushMS-res.FreezeMS)
	} else {
		fmt.Printf("forked %s onto %s (nothing paused); pushed %.1f MiB (%d of %d chunks) in %.0f ms\n",
			res.Source, res.Host, mib(res.Push.BytesOut), res.Push.Received.ChunksSent, res.Push.Received.Chunks, res.PushMS-res.FreezeMS)
	}
	if res.Migration != nil {
		fmt.Printf("live (postcopy): only the disks pushed; %.1f MiB of RAM migrated, the child ran %.0f ms after migrate, all of its RAM there after %.0f ms\n",
			mib(res.Migration.Bytes), res.Migration.SwitchoverMS, res.Migration.TotalMS)
	}
	fmt.Printf("on %s: first child running %.0f ms, all ready %.0f ms after the start\n", res.Host, res.RunningMS, res.ReadyMS)
	printFork(res.Fork)
}

// forkServeCommand is what fork --to runs on the other host.
var forkServeCommand = &cli.Command{
	Name:      "fork-serve",
	Usage:     "the other end of a fork --to: fork a pushed template, print the result, keep the children only on commit (run by ssh)",
	ArgsUsage: "TEMPLATE [NAME...]",
	Hidden:    true,
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() < 1 {
			return usageError{fmt.Errorf("fork-serve needs the pushed template")}
		}
		req, err := forkRequest(cliCtx)
		if err != nil {
			return err
		}
		incoming := cliCtx.String("incoming")
		if incoming != "" {
			if err := vmfork.CheckIncomingSocket(incoming); err != nil {
				return usageError{err}
			}
		}
		// A write to a session whose link died must fail (and the children
		// be removed), not kill vmfork with SIGPIPE half-way.
		signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
		// Nor may a hang-up from sshd as the session goes end it before it
		// has undone its children and given up the pushed template.
		signal.Ignore(syscall.SIGHUP)
		return run(cliCtx, func(v verb) error {
			_, err := v.mg.ServeFork(v.ctx, req, incoming, os.Stdin, os.Stdout, cliCtx.Duration("idle-timeout"))
			return err
		})
	},
}
