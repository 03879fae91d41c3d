package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/ledger"
)

// ledgerDirName is the family ledger's directory in the state dir: the
// server's lock, PID file, control socket and log, and families/.
const ledgerDirName = "ledger"

// ledgerLogMax: a server log over this size is moved to server.log.1 when
// the next server starts.
const ledgerLogMax = 4 << 20

// ledgerServerCommand is the family ledger's server (ledger/doc.go):
// started detached by the first command that runs a machine
// (ledgerStarter), it serves every running machine's ledger port and exits
// once no machine has run for a minute.
var ledgerServerCommand = &cli.Command{
	Name:   "ledger-server",
	Usage:  "serve the family ledger's port of every running machine, until none runs (started by vmfork itself)",
	Hidden: true,
	Action: func(cliCtx *cli.Context) error {
		dir, err := ledgerDir(cliCtx)
		if err != nil {
			return err
		}
		// Its stderr is a log file (ledgerStarter) read after the fact:
		// timestamps, which the CLI's own logging leaves out.
		l := logrus.New()
		l.SetOutput(os.Stderr)
		l.SetLevel(logrus.GetLevel())
		l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "2006-01-02T15:04:05.000Z07:00"})
		srv, err := ledger.NewServer(ledger.ServerOptions{
			Dir:      dir,
			Log:      logrus.NewEntry(l),
			Discover: ledgerDiscover(cliCtx),
		})
		if err != nil {
			return err
		}
		// No --timeout: the server lives as long as a machine runs.
		if err := srv.Run(cliCtx.Context); err != nil && !errors.Is(err, ledger.ErrRunning) {
			l.WithError(err).Error("ledger server failed")
			return err
		}
		return nil
	},
}

// ledgerDir is <state-dir>/ledger, absolute.
func ledgerDir(cliCtx *cli.Context) (string, error) {
	state := absPath(cliCtx.String("state-dir"))
	if state == "" {
		return "", usageError{fmt.Errorf("ledger: no --state-dir")}
	}
	return filepath.Join(state, ledgerDirName), nil
}

// ledgerClient is how the Manager and vmfork ledger reach the family
// ledger; its Start runs `vmfork ledger-server` on demand.
func ledgerClient(cliCtx *cli.Context) (*ledger.Client, error) {
	dir, err := ledgerDir(cliCtx)
	if err != nil {
		return nil, err
	}
	return &ledger.Client{Dir: dir, Start: ledgerStarter(cliCtx)}, nil
}

// ledgerStarter starts `vmfork ledger-server` for the same state dir, as
// reaperStarter starts the reaper: in a session of its own (no terminal's
// signals reach it), its working directory at /, stdin and stdout on
// /dev/null and stderr on <ledger dir>/server.log, so that it outlives
// this command and a SIGKILL of it. It does not wait: the Client waits
// until the server answers. Two commands that start one at once start
// two, and the second exits (ledger.ErrRunning).
func ledgerStarter(cliCtx *cli.Context) func(context.Context) error {
	return func(context.Context) error {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("ledger server: %w", err)
		}
		dir, err := ledgerDir(cliCtx)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("ledger server: %w", err)
		}
		logPath := filepath.Join(dir, "server.log")
		if fi, err := os.Stat(logPath); err == nil && fi.Size() > ledgerLogMax {
			os.Rename(logPath, logPath+".1")
		}
		logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("ledger server: %w", err)
		}
		defer logf.Close()
		args := []string{"--state-dir", filepath.Dir(dir), "--log-level", cliCtx.String("log-level"), "ledger-server"}
		cmd := exec.Command(exe, args...)
		cmd.Dir = "/"
		cmd.Stderr = logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("ledger server: %w", err)
		}
		// Reaped when it exits, should this process live that long.
		go cmd.Wait()
		return nil
	}
}

// ledgerDiscover is how a starting server (and one about to exit when
// idle) finds the machines it must serve: the state dir's machines
// recorded running with a ledger port, their families and their
// <machine dir>/ledger.sock (vmfork.Store.LedgerMachines). It reads
// records only: the server starts no driver and repairs nothing.
func ledgerDiscover(cliCtx *cli.Context) ledger.DiscoverFunc {
	state := absPath(cliCtx.String("state-dir"))
	return func(context.Context) ([]ledger.Machine, error) {
		return (&vmfork.Store{StateDir: state}).LedgerMachines()
	}
}
