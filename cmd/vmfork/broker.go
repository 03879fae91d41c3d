package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork/broker"
)

// brokerLogMax is the size past which a starting broker's log is started
// afresh rather than appended to.
const brokerLogMax = 4 << 20

// brokerCommand is the secrets broker (package broker): started detached
// by the first command that registers a machine with brokered secrets, it
// serves each registered machine's proxy, holding the values in its
// memory only, and exits once no machine has been registered for --idle.
var brokerCommand = &cli.Command{
	Name:   "broker",
	Usage:  "serve the proxies that put brokered secrets into machines' requests, until no machine has one (started by vmfork itself)",
	Hidden: true,
	Flags: []cli.Flag{
		&cli.StringFlag{
			Name:    "extra-roots",
			Usage:   "PEM file of CA certificates trusted for servers besides the host's trust store",
			EnvVars: []string{"VMFORK_BROKER_EXTRA_ROOTS"},
		},
		&cli.DurationFlag{
			Name:  "idle",
			Usage: "exit once no machine has been registered for this long",
			Value: broker.DefaultIdle,
		},
	},
	Action: func(cliCtx *cli.Context) error {
		// Its memory holds every registered machine's values.
		if err := broker.Harden(); err != nil {
			return err
		}
		roots, err := readRoots(cliCtx.String("extra-roots"))
		if err != nil {
			return usageError{fmt.Errorf("--extra-roots: %w", err)}
		}
		srv, err := broker.NewServer(broker.Config{
			Dir:   brokerDir(cliCtx),
			Idle:  cliCtx.Duration("idle"),
			Proxy: broker.Options{ExtraRoots: roots},
			Log:   logrus.NewEntry(logrus.StandardLogger()),
		})
		if err != nil {
			return err
		}
		// No --timeout: the broker lives as long as a machine is registered.
		if err := srv.Serve(cliCtx.Context); !errors.Is(err, broker.ErrRunning) {
			return err
		}
		return nil // another broker serves this state dir
	},
}

// brokerDir is the broker's directory: its control socket, lock, PID,
// registry (no values) and log, and vmfork's CA.
func brokerDir(cliCtx *cli.Context) string {
	return filepath.Join(absPath(cliCtx.String("state-dir")), "broker")
}

// brokerClient is how a command registers machines with the broker of its
// state dir, starting one (brokerStarter) when none runs.
func brokerClient(cliCtx *cli.Context) *broker.Client {
	return &broker.Client{Dir: brokerDir(cliCtx), Start: brokerStarter(cliCtx)}
}

// brokerStarter starts `vmfork broker` for the same state dir, as the
// reaper is started (reaperStarter): in a session of its own, working
// directory /, so it outlives this command and a SIGKILL of it; its
// output goes to broker.log in its directory (the broker never logs a
// value). It inherits this command's environment, which exec hooks it
// runs again after a restart see.
func brokerStarter(cliCtx *cli.Context) broker.Starter {
	return func(context.Context) error {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		dir := brokerDir(cliCtx)
		flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
		if fi, err := os.Stat(filepath.Join(dir, broker.LogFile)); err == nil && fi.Size() > brokerLogMax {
			flags |= os.O_TRUNC
		}
		logf, err := os.OpenFile(filepath.Join(dir, broker.LogFile), flags, 0o600)
		if err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		defer logf.Close()
		args := []string{"--state-dir", absPath(cliCtx.String("state-dir")), "--log-level", cliCtx.String("log-level"), "broker"}
		cmd := exec.Command(exe, args...)
		cmd.Dir = "/"
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		// Reaped when it exits, should this process live that long.
		go cmd.Wait()
		return nil
	}
}

// readRoots reads the certificates of a PEM file ("" for none).
func readRoots(file string) ([]*x509.Certificate, error) {
	if file == "" {
		return nil, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var certs []*x509.Certificate
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%s: no PEM certificate", file)
	}
	return certs, nil
}
