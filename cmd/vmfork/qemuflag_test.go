package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestResolveQEMU(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	exe := filepath.Join(dir, "qemu-stub")
	for p, mode := range map[string]os.FileMode{plain: 0o644, exe: 0o755} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ name, says string }{
		{filepath.Join(dir, "nope"), "does not exist"},
		{"vmfork-no-such-qemu", "does not exist"},
		{dir, "is a directory"},
		{plain, "is not an executable file"},
	} {
		_, err := resolveQEMU(c.name)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("resolveQEMU(%q) = %v, want a usage error naming it that says %q", c.name, err, c.says)
		}
	}
	if got, err := resolveQEMU(exe); err != nil || got != exe {
		t.Fatalf("resolveQEMU(%q) = %q, %v; want the path and nil", exe, got, err)
	}
	// The binary reaches the driver as an argument, not through the
	// environment: a later command of this process sees no trace of it.
	if got := os.Getenv(qemuEnv); got != "" {
		t.Errorf("%s = %q after resolveQEMU, want it untouched", qemuEnv, got)
	}
}
