package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmfork/vmfork/broker"
)

// TestBrokerCommand runs `vmfork broker` as the broker's starter runs it:
// it makes its directory and CA, answers on its control socket, and exits
// by itself once idle.
func TestBrokerCommand(t *testing.T) {
	state := t.TempDir()
	app := newApp()
	done := make(chan error, 1)
	go func() {
		done <- app.RunContext(context.Background(), []string{"vmfork", "--state-dir", state, "--log-level", "error", "broker", "--idle", "500ms"})
	}()
	dir := filepath.Join(state, "broker")
	c := &broker.Client{Dir: dir, Start: func(context.Context) error { return nil }, Timeout: 10 * time.Second}
	if err := c.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	if list, err := c.List(t.Context()); err != nil || len(list) != 0 {
		t.Errorf("List: %v, %v; want none", list, err)
	}
	for _, f := range []string{broker.CACertFile, broker.CAKeyFile, broker.SocketFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("vmfork broker: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("vmfork broker did not exit once idle")
	}
	if err := c.Ping(t.Context()); !errors.Is(err, broker.ErrNotRunning) {
		t.Errorf("after the exit: %v, want ErrNotRunning", err)
	}
	if _, err := readRoots(filepath.Join(dir, broker.CAKeyFile)); err == nil {
		t.Error("readRoots of a key file: no error")
	}
	if roots, err := readRoots(filepath.Join(dir, broker.CACertFile)); err != nil || len(roots) != 1 {
		t.Errorf("readRoots of the CA: %v, %v", roots, err)
	}
}
