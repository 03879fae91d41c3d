package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

// ttlFlag is shared by boot, fork and template save.
var ttlFlag = &cli.DurationFlag{
	Name:  "ttl",
	Usage: "remove it this long after it is made (a fork child: from its fork's start), even with no vmfork command running (e.g. 30m; 0: never)",
}

// checkTTLFlag refuses a bad --ttl before anything is done.
func checkTTLFlag(cliCtx *cli.Context) error {
	if err := vmfork.CheckTTL(cliCtx.Duration("ttl")); err != nil {
		return usageError{fmt.Errorf("--ttl: %w", err)}
	}
	return nil
}

// applyTTL gives name the --ttl deadline, if one was asked for.
func applyTTL(ctx context.Context, cliCtx *cli.Context, mg *vmfork.Manager, name string) (time.Time, error) {
	if cliCtx.Duration("ttl") == 0 {
		return time.Time{}, nil
	}
	return mg.SetTTL(ctx, name, cliCtx.Duration("ttl"))
}

// reaperCommand is the reaper process (ttl.go in the root package):
// started detached by the command that sets a deadline, it removes what
// expires and exits once nothing in the store has a deadline.
var reaperCommand = &cli.Command{
	Name:   "reaper",
	Usage:  "remove machines and templates whose TTL passed, until none has one (started by vmfork itself)",
	Hidden: true,
	Action: func(cliCtx *cli.Context) error {
		mg, err := newManager(cliCtx)
		if err != nil {
			return err
		}
		// No --timeout: the reaper lives as long as a deadline does.
		return mg.RunReaper(cliCtx.Context, vmfork.ReaperPoll)
	},
}

// reaperStarter starts `vmfork reaper` for the same store and driver: in a
// session of its own (no terminal's signals reach it), with stdio on
// /dev/null (it holds no pipe of ours) and its working directory at /, so
// it outlives this command and a SIGKILL of it.
func reaperStarter(cliCtx *cli.Context) vmfork.ReaperStarter {
	return func(context.Context) error {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("reaper: %w", err)
		}
		state, err := absDir(cliCtx.String("state-dir"))
		if err != nil {
			return err
		}
		mem, err := absDir(cliCtx.String("mem-dir"))
		if err != nil {
			return err
		}
		args := []string{"--state-dir", state, "--mem-dir", mem, "--log-level", cliCtx.String("log-level")}
		if uri := cliCtx.String("connect"); uri != "" {
			args = append(args, "--connect", uri)
		}
		if qemu, err := qemuOf(cliCtx); err == nil && qemu != "" {
			args = append(args, "--qemu", qemu)
		}
		cmd := exec.Command(exe, append(args, "reaper")...)
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("reaper: %w", err)
		}
		// Reaped when it exits, should this process live that long (a
		// program embedding vmfork); a CLI exits long before.
		go cmd.Wait()
		return nil
	}
}

func absDir(p string) (string, error) {
	a := absPath(p)
	if a == "" {
		return "", fmt.Errorf("reaper: empty directory")
	}
	return a, nil
}

// ttlText is the TTL column of ls: what is left, or "-" for none.
func ttlText(v machineView) string {
	switch {
	case v.Expires.IsZero():
		return "-"
	case v.TTLLeftS <= 0:
		return "expired"
	}
	return (time.Duration(v.TTLLeftS) * time.Second).String()
}

// joinLine joins two errors on one line, keeping both for errors.Is.
func joinLine(a, b error) error {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return fmt.Errorf("%w; %w", a, b)
}
