package main

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/ledger"
	"github.com/vmfork/vmfork/profile"
)

// TestLedgerServerCommand runs `vmfork ledger-server` in-process: it
// serves a machine registered through the control socket, a second one
// for the same state dir exits at once with success, and it stops on
// cancel.
func TestLedgerServerCommand(t *testing.T) {
	state := t.TempDir()
	run := func(ctx context.Context) chan error {
		done := make(chan error, 1)
		go func() {
			app := newApp()
			done <- app.RunContext(ctx, []string{"vmfork", "--state-dir", state, "ledger-server"})
		}()
		return done
	}
	ctx, cancel := context.WithCancel(t.Context())
	first := run(ctx)
	c := &ledger.Client{Dir: filepath.Join(state, ledgerDirName)}
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(t.Context()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the ledger server did not answer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := <-run(t.Context()); err != nil {
		t.Fatalf("a second server: got %v, want nil (one runs)", err)
	}

	// A machine's QEMU, played by a socket the server connects to.
	sock := filepath.Join(state, "m.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := c.Attach(t.Context(), ledger.Machine{Name: "m", Family: "fam", Socket: sock}); err != nil {
		t.Fatal(err)
	}
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	conn.Write([]byte("claim pay-42\n"))
	buf := make([]byte, 64)
	n, _ := conn.Read(buf)
	if got := string(buf[:n]); got != "granted\n" {
		t.Fatalf("claim: got %q, want granted", got)
	}
	recs, err := c.List(t.Context(), "fam")
	if err != nil || len(recs) != 1 || recs[0].Holder != "m" {
		t.Fatalf("list: %+v, %v", recs, err)
	}
	cancel()
	select {
	case err := <-first:
		if err != nil {
			t.Fatalf("server: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not stop on cancel")
	}
	if err := c.Ping(t.Context()); !errors.Is(err, ledger.ErrNoServer) {
		t.Fatalf("after stop: got %v, want ErrNoServer", err)
	}
}

// The port the drivers declare is the one the guest helper looks for.
func TestLedgerPortName(t *testing.T) {
	if profile.LedgerChannel != ledger.PortName {
		t.Fatalf("drivers declare %q, the helper opens %q", profile.LedgerChannel, ledger.PortName)
	}
}

// ledgerDiscover lists the state dir's running machines that have a
// ledger socket, with their family.
func TestLedgerDiscover(t *testing.T) {
	state := t.TempDir()
	store, err := vmfork.OpenStore(state, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var sockets []net.Listener
	defer func() {
		for _, l := range sockets {
			l.Close()
		}
	}()
	for _, m := range []struct {
		name  string
		state vmfork.State
		port  bool
	}{{"web", vmfork.StateRunning, true}, {"off", vmfork.StateStopped, true}, {"old", vmfork.StateRunning, false}} {
		rec := &vmfork.Machine{Name: m.name, State: m.state, Family: "fam1", Paths: store.MachinePaths(m.name)}
		rec.Spec.LedgerPort = m.port
		if err := store.CreateMachine(rec); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("unix", rec.Paths.Ledger)
		if err != nil {
			t.Fatal(err)
		}
		sockets = append(sockets, l)
	}
	app := newApp()
	var got []ledger.Machine
	app.Commands = append(app.Commands, &cli.Command{Name: "discover", Action: func(cliCtx *cli.Context) error {
		got, err = ledgerDiscover(cliCtx)(cliCtx.Context)
		return err
	}})
	if err := app.Run([]string{"vmfork", "--state-dir", state, "discover"}); err != nil {
		t.Fatal(err)
	}
	want := []ledger.Machine{{Name: "web", Family: "fam1", Socket: filepath.Join(state, "machines", "web", "ledger.sock")}}
	if len(got) != 1 || got[0] != want[0] {
		t.Fatalf("discover: %+v, want %+v", got, want)
	}
}
