package qemudrv

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
)

// oneLine fails the test unless err is one ErrUnsupported line saying each
// of want.
func oneLine(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, vmfork.ErrUnsupported) || strings.Contains(err.Error(), "\n") {
		t.Errorf("%s: %v; want one ErrUnsupported line", what, err)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %v; want it to say %q", what, err, w)
		}
	}
}

// The allow list is read as qemu-bridge-helper reads it: allow and deny
// lines, "all", includes, a deny winning; each refusal names the line to
// add, and a list vmfork cannot read is left to the helper.
func TestBridgeAllowed(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	inc := write("inc.conf", "allow br1\n")
	for _, c := range []struct {
		conf string
		says string // "" for allowed
	}{
		{write("a.conf", "# comment\nallow br0\n"), ""},
		{write("all.conf", "allow all\n"), ""},
		{write("inc-main.conf", "include "+inc+"\nallow br0\n"), ""},
		{write("other.conf", "allow br1\n"), "echo 'allow br0' >>"},
		{write("deny.conf", "allow br0\ndeny br0\n"), "denies bridge"},
		{write("denyall.conf", "allow br0\ndeny all\n"), "denies bridge"},
		{filepath.Join(dir, "missing.conf"), "does not exist"},
	} {
		err := bridgeAllowed(c.conf, "br0")
		if c.says == "" {
			if err != nil {
				t.Errorf("%s: %v, want br0 allowed", c.conf, err)
			}
			continue
		}
		oneLine(t, c.conf, err, c.says, "br0")
	}
	if os.Geteuid() != 0 {
		closed := write("closed.conf", "deny all\n")
		os.Chmod(closed, 0)
		if err := bridgeAllowed(closed, "br0"); err != nil {
			t.Errorf("an unreadable list: %v; want it left to the helper", err)
		}
	}
}

// A helper without setuid root or cap_net_admin, or none at all, is
// refused in one line naming the setup command.
func TestBridgeHelperPrivileged(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "qemu-bridge-helper")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	oneLine(t, "plain helper", helperPrivileged(plain), "chmod u+s "+plain, "run vmfork as root")
	oneLine(t, "no helper", helperPrivileged(filepath.Join(dir, "none")), "none")
	if os.Geteuid() == 0 {
		if err := os.Chmod(plain, os.ModeSetuid|0o755); err != nil {
			t.Fatal(err)
		}
		if err := helperPrivileged(plain); err != nil {
			t.Errorf("setuid-root helper: %v, want accepted", err)
		}
	}
	old := bridgeHelpers
	t.Cleanup(func() { bridgeHelpers = old })
	bridgeHelpers = []string{filepath.Join(dir, "none")}
	t.Setenv("VMFORK_BRIDGE_HELPER", "")
	_, err := bridgeHelper("br0")
	oneLine(t, "no helper installed", err, "qemu-system-common", "--network user")
}
