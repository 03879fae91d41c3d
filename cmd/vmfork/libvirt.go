package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/libvirtdrv"
)

var libvirtCommand = &cli.Command{
	Name:  "libvirt",
	Usage: "prepare a libvirt host for forking and check domains",
	Description: `Forking libvirt domains (vmfork -c qemu:///system ...) needs a start hook
in libvirt and guest RAM on a tmpfs. "vmfork libvirt setup" installs both,
once per host; "vmfork libvirt check DOMAIN" tells what to change in a
domain's XML to make it forkable.`,
	Subcommands: []*cli.Command{libvirtSetupCommand, libvirtCheckCommand, libvirtHookCommand, libvirtReapCommand},
}

var libvirtSetupCommand = &cli.Command{
	Name:  "setup",
	Usage: "install vmfork's libvirt start hook and put guest RAM on a tmpfs; idempotent",
	Description: `Makes this host's libvirtd able to start vmfork's fork children, and says
what it changed (nothing, when run again):

  - installs ` + libvirtdrv.DefaultHookDir + `/` + libvirtdrv.HookName + `, a drop-in that links a fork
    child's frozen template RAM to where libvirt tells QEMU to find guest RAM
    (other domains pass through it untouched);
  - gives /dev/kvm group kvm and mode 0660, as udev does, where it lacks
    them (hosts without udev): libvirt whose QEMU user cannot open it
    re-probes QEMU on every API call, seconds each; the device node is made
    again at boot, so run setup after each boot on such hosts;
  - sets memory_backing_dir in qemu.conf to a tmpfs when libvirt's RAM
    directory is on disk, and then restarts libvirtd (running domains keep
    running); otherwise sends libvirtd SIGHUP when the hook is new.

The hook runs this vmfork binary: run setup again after moving it.

With --connect qemu:///session (libvirt's daemon of an ordinary user, run
as that user) setup installs no hook (children map their template in
place) and leaves /dev/kvm alone (QEMU runs as the user: group kvm is the
user's business). It only sets memory_backing_dir in the user's
~/.config/libvirt/qemu.conf to /dev/shm/vmfork-UID-libvirt, a tmpfs beside
vmfork's mem dir (the default, ~/.config/libvirt/qemu/ram, is on disk, where
a fork child cannot be forked again). --hook-dir and --qemu-conf are for
qemu:///system.`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "hook-dir", Usage: "libvirt's qemu hook drop-in directory", Value: libvirtdrv.DefaultHookDir},
		&cli.StringFlag{Name: "qemu-conf", Usage: "libvirt's qemu.conf", Value: libvirtdrv.DefaultQEMUConf},
		&cli.StringFlag{Name: "memory-backing-dir", Usage: "tmpfs directory to set as memory_backing_dir when needed", Value: "/dev/shm"},
		&cli.BoolFlag{Name: "dry-run", Aliases: []string{"check-mode"}, Usage: "say what would change and change nothing"},
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 0 {
			return usageError{fmt.Errorf("libvirt setup takes no arguments")}
		}
		ctx, cancel := appContext(cliCtx)
		defer cancel()
		session := libvirtdrv.IsLocalSession(cliCtx.String("connect"))
		var res *libvirtdrv.SetupResult
		var err error
		if session {
			if res, err = sessionSetup(cliCtx); err != nil {
				return err
			}
		} else {
			res, err = libvirtdrv.Setup(ctx, libvirtdrv.SetupOptions{
				HookDir:          cliCtx.String("hook-dir"),
				QEMUConf:         cliCtx.String("qemu-conf"),
				MemoryBackingDir: cliCtx.String("memory-backing-dir"),
				DryRun:           cliCtx.Bool("dry-run"),
			})
		}
		if res == nil {
			return err
		}
		if err == nil && !res.DryRun && !session {
			// Only a running libvirtd can tell whether it still re-probes.
			if drv, derr := openLibvirt(cliCtx.String("connect"), "libvirt setup"); derr == nil {
				if r, ok := drv.(reprober); ok {
					if p, perr := r.Reprobes(ctx); perr != nil {
						res.Problems = append(res.Problems, perr.Error())
					} else if p != "" {
						res.Problems = append(res.Problems, p)
					}
				}
				closeDriver(drv)
			}
		}
		if cliCtx.Bool("json") {
			if perr := printJSON(res); perr != nil {
				return perr
			}
			return err
		}
		verb := "changed"
		if res.DryRun {
			verb = "would change"
		}
		for _, c := range res.Changes {
			fmt.Printf("%s: %s\n", verb, c)
		}
		if !res.Changed {
			fmt.Println("nothing to change: libvirt is set up for vmfork")
		}
		fmt.Printf("libvirtd: %s\nguest RAM directories: %s\n", res.Libvirtd, res.MemoryBackingDir)
		for _, p := range res.Problems {
			fmt.Fprintf(os.Stderr, "vmfork: warning: %s\n", p)
		}
		return err
	},
}

// sessionSetup is libvirt setup for the user's session daemon; the system
// daemon's flags are refused rather than ignored.
func sessionSetup(cliCtx *cli.Context) (*libvirtdrv.SetupResult, error) {
	for _, f := range []string{"hook-dir", "qemu-conf", "memory-backing-dir"} {
		if cliCtx.IsSet(f) {
			return nil, usageError{fmt.Errorf("libvirt setup --%s is for qemu:///system: with %s setup writes %s only", f, cliCtx.String("connect"), libvirtdrv.SessionQEMUConf())}
		}
	}
	if os.Geteuid() == 0 {
		return nil, usageError{fmt.Errorf("libvirt setup for %s as root: root's session daemon is not what users get; run it as the user, or use qemu:///system", cliCtx.String("connect"))}
	}
	return libvirtdrv.SessionSetup(libvirtdrv.SessionQEMUConf(), libvirtdrv.SessionMemoryBackingDir(), cliCtx.Bool("dry-run"))
}

// domainChecker is the libvirt driver's check of any domain's XML.
type domainChecker interface {
	CheckDomain(ctx context.Context, name string) error
}

var libvirtCheckCommand = &cli.Command{
	Name:      "check",
	Usage:     "say whether this host's libvirt can run forks, and whether a domain can be forked",
	ArgsUsage: "[DOMAIN]",
	Description: `Checks the host first: a /dev/kvm that libvirt's QEMU user cannot open
makes libvirt 9.0 re-probe QEMU on every call (seconds each); the check
times two calls to tell. With DOMAIN it also reads the domain's XML (the
live one if it runs) and lists everything that stops it from being forked,
each with the element to change: guest RAM that is not a shared file
(<memoryBacking>), a balloon (<memballoon>), devices whose state QEMU
cannot save (<hostdev>, <shmem>) and so on. Exit code 0 means the host is
fine and the domain forkable. Uses --connect, or qemu:///system.`,
	Flags: []cli.Flag{jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() > 1 {
			return usageError{fmt.Errorf("libvirt check takes at most one domain name, got %d arguments", cliCtx.NArg())}
		}
		name := cliCtx.Args().First()
		ctx, cancel := appContext(cliCtx)
		defer cancel()
		drv, err := openLibvirt(cliCtx.String("connect"), "libvirt check")
		if err != nil {
			return err
		}
		defer closeDriver(drv)
		host := libvirtHostProblems(ctx, drv)
		var ue *libvirtdrv.UnforkableError
		if name != "" {
			checker, ok := drv.(domainChecker)
			if !ok {
				return fmt.Errorf("libvirt check: driver %q: %w", drv.Name(), vmfork.ErrUnsupported)
			}
			err = checker.CheckDomain(ctx, name)
			if err != nil && !errors.As(err, &ue) {
				return err
			}
		}
		if cliCtx.Bool("json") {
			out := struct {
				Domain       string               `json:"domain,omitempty"`
				Forkable     bool                 `json:"forkable"`
				HostOK       bool                 `json:"host_ok"`
				HostProblems []string             `json:"host_problems"`
				Problems     []libvirtdrv.Problem `json:"problems"`
			}{Domain: name, Forkable: name != "" && ue == nil, HostOK: len(host) == 0, HostProblems: host, Problems: []libvirtdrv.Problem{}}
			if ue != nil {
				out.Problems = ue.Problems
			}
			if perr := printJSON(out); perr != nil {
				return perr
			}
		} else {
			for _, p := range host {
				fmt.Printf("host: %s\n", p)
			}
			if len(host) == 0 {
				fmt.Println("host: libvirt can run vmfork's domains")
			}
			if name != "" && ue == nil {
				fmt.Printf("%s can be forked\n", name)
			}
		}
		if err == nil && len(host) > 0 {
			err = fmt.Errorf("libvirt check: %s", host[0])
		}
		return err
	},
}

// libvirtHookCommand is what the hook drop-in runs. libvirtd waits for it,
// so it never calls libvirt; it reads the domain XML from stdin.
var libvirtHookCommand = &cli.Command{
	Name:      "hook",
	Hidden:    true,
	Usage:     "libvirt qemu hook (run by libvirtd)",
	ArgsUsage: "DOMAIN OPERATION SUB-OPERATION EXTRA",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "qemu-conf", Value: libvirtdrv.DefaultQEMUConf},
	},
	Action: func(cliCtx *cli.Context) error {
		return libvirtdrv.Hook(cliCtx.Args().Slice(), os.Stdin, libvirtdrv.HookOptions{
			QEMUConf: cliCtx.String("qemu-conf"),
			Reap:     startReaper,
		})
	},
}

// startReaper starts `vmfork libvirt reap` for a fork child whose domain
// ended, and does not wait for it: libvirtd waits for the hook, and the
// reaper must wait for libvirtd. It gets no stdio (libvirtd reads the hook's
// output until EOF) and a session of its own.
func startReaper(r libvirtdrv.ReapRequest) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, "--state-dir", r.StateDir, "--mem-dir", r.MemDir, "--connect", r.URI, "--quiet",
		"libvirt", "reap", "--uuid", r.UUID, r.Machine)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start reaper: %w", err)
	}
	return cmd.Process.Release()
}

// reaper is the libvirt driver's wait for libvirt to forget a child's domain.
type reaper interface {
	WaitDomainGone(ctx context.Context, name, uuid string) error
}

var libvirtReapCommand = &cli.Command{
	Name:      "reap",
	Hidden:    true,
	Usage:     "remove a fork child whose domain ended (run by the libvirt hook)",
	ArgsUsage: "MACHINE",
	Flags:     []cli.Flag{&cli.StringFlag{Name: "uuid", Required: true}},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{fmt.Errorf("libvirt reap takes exactly one machine name")}
		}
		// The hook runs this when a child's domain ends, which is also
		// while its store is being removed (its owner's rm -rf, a test's
		// cleanup): then there is nothing to reap, and opening the store
		// would make its directories again.
		if gone := storeGone(cliCtx.String("state-dir"), cliCtx.String("mem-dir")); gone != "" {
			logrus.WithField("dir", gone).Debug("libvirt reap: the store is gone; nothing to reap")
			return nil
		}
		name := cliCtx.Args().First()
		return run(cliCtx, func(v verb) error {
			r, ok := v.mg.Driver.(reaper)
			if !ok {
				return fmt.Errorf("libvirt reap: driver %q: %w", v.mg.Driver.Name(), vmfork.ErrUnsupported)
			}
			if err := r.WaitDomainGone(v.ctx, name, cliCtx.String("uuid")); err != nil {
				return err
			}
			return v.mg.RemoveEnded(v.ctx, name)
		})
	},
}

// storeGone returns the first of the store's directories that does not
// exist, or "".
func storeGone(dirs ...string) string {
	for _, d := range dirs {
		if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
			return d
		}
	}
	return ""
}
