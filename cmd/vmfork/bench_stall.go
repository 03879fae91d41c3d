//go:build bench

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork/tests/bench"
)

var benchStallCommand = &cli.Command{
	Name:  "stall",
	Usage: "the stall a client of the source sees during a fork, and the whole clone against virsh save + restore",
	Description: `For each --memory size (with its --guest-use), boots a source with a port
forward to an echo service in it (busybox nc) and connects a client that
sends one byte and waits for it every --interval. Per round it measures the
client's gaps between replies in three windows:

   quiet    nothing happens: the client's own noise on this host
   floor    QEMU stop, device-state save (as the fork saves it: the device
            sections alone, or a migration stream), cont of the same
            source with nothing else
   fork     vmfork fork of the source, one child, until --tail after the
            call returned (the child is then removed)

and reports the longest gap and the p99 of each; the target is fork ÷ floor
<= 1.5. The whole clone is the fork call until its first child is READY.
Then (unless --no-libvirt) the source is removed and a libvirt domain of the
same guest, RAM and use is cloned the libvirt way each round: virsh save,
then virsh restore until its agent answers (target: >= 10x the fork).

With --driver libvirt the source is booted and forked through vmfork's
libvirt driver, and the floor is the calls its freeze makes with nothing
else: virDomainSuspend, the device-state save through libvirt's QMP
passthrough, virDomainResume (the host must be set up: vmfork libvirt setup).

   vmfork bench stall --memory 256M --rounds 2 --no-libvirt     (a quick look)
   vmfork bench stall --driver libvirt --memory 512M,4G          (the same on libvirt)
   vmfork bench stall --memory 512M,4G --guest-use 0,3G          (issue 11's sizes)`,
	Flags: append([]cli.Flag{
		&cli.StringFlag{Name: "memory", Aliases: []string{"m"}, Usage: "source RAM sizes, comma-separated", Value: "512M,4G"},
		&cli.StringFlag{Name: "guest-use", Usage: "non-zero data in each source: one value (75%, 1536M) or one per --memory size", Value: "0,3G"},
		&cli.IntFlag{Name: "rounds", Usage: "rounds per size (a quiet window, the floor and a fork each)", Value: 3},
		&cli.DurationFlag{Name: "interval", Usage: "how often the client sends a byte", Value: 2 * time.Millisecond},
		&cli.DurationFlag{Name: "tail", Usage: "how long each window stays open after the call returned", Value: 500 * time.Millisecond},
		&cli.StringFlag{Name: "libvirt", Usage: "libvirt URI of the save/restore comparator", Value: "qemu:///system"},
		&cli.BoolFlag{Name: "no-libvirt", Usage: "leave the libvirt save/restore comparator out"},
		&cli.StringFlag{Name: "driver", Usage: "vmfork driver the source is forked through: embedded or libvirt", Value: bench.DriverEmbedded},
	}, benchCommonFlags...),
	Action: func(cliCtx *cli.Context) error {
		mems, err := parseMemories(cliCtx.String("memory"))
		if err != nil {
			return err
		}
		var uses []bench.GuestUse
		for _, f := range strings.Split(cliCtx.String("guest-use"), ",") {
			u, err := bench.ParseGuestUse(f)
			if err != nil {
				return usageError{fmt.Errorf("--guest-use: %w", err)}
			}
			uses = append(uses, u)
		}
		// The default pairs with the default sizes; with other sizes and
		// no --guest-use, the sources idle.
		if !cliCtx.IsSet("guest-use") && cliCtx.IsSet("memory") {
			uses = nil
		}
		if len(uses) > 1 && len(uses) != len(mems) {
			return usageError{fmt.Errorf("--guest-use has %d values for %d --memory sizes", len(uses), len(mems))}
		}
		opt := bench.StallOptions{MemoryMiB: mems, GuestUse: uses, Rounds: cliCtx.Int("rounds"),
			Interval: cliCtx.Duration("interval"), Tail: cliCtx.Duration("tail"), Driver: cliCtx.String("driver")}
		switch opt.Driver {
		case bench.DriverEmbedded:
		case bench.DriverLibvirt:
			if cliCtx.Bool("no-libvirt") {
				return usageError{fmt.Errorf("--driver %s: needs libvirt, not --no-libvirt", opt.Driver)}
			}
		default:
			return usageError{fmt.Errorf("--driver %q: want %s or %s", opt.Driver, bench.DriverEmbedded, bench.DriverLibvirt)}
		}
		if opt.Rounds < 1 {
			return usageError{fmt.Errorf("--rounds %d: want at least 1", opt.Rounds)}
		}
		if opt.Interval < 100*time.Microsecond || opt.Interval > time.Second {
			return usageError{fmt.Errorf("--interval %v: want from 100µs to 1s", opt.Interval)}
		}
		if opt.Tail <= 0 || opt.Tail > time.Minute {
			return usageError{fmt.Errorf("--tail %v: want more than 0 and at most 1m", opt.Tail)}
		}
		for i, m := range mems {
			u := bench.GuestUse{}
			switch {
			case len(uses) == 1:
				u = uses[0]
			case len(uses) > 1:
				u = uses[i]
			}
			if _, err := u.MiBFor(m); err != nil {
				return usageError{fmt.Errorf("--guest-use: %w", err)}
			}
		}
		uri := cliCtx.String("libvirt")
		if cliCtx.Bool("no-libvirt") {
			uri = ""
		}
		return runBench(cliCtx, uri, func(ctx context.Context, e *bench.Env) (benchResult, error) {
			r, err := bench.Stall(ctx, e, opt)
			if r == nil {
				if err == nil {
					err = errors.New("bench stall: nothing measured")
				}
				return nil, err // nothing measured (a check failed before anything booted)
			}
			return r, err
		})
	},
}
