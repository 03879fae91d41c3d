package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUseQEMU(t *testing.T) {
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
		t.Setenv(qemuEnv, "")
		err := useQEMU(c.name)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("useQEMU(%q) = %v, want a usage error naming it that says %q", c.name, err, c.says)
		}
		if got := os.Getenv(qemuEnv); got != "" {
			t.Errorf("useQEMU(%q) failed but set %s=%q", c.name, qemuEnv, got)
		}
	}
	if err := useQEMU(exe); err != nil {
		t.Fatalf("useQEMU(%q) = %v, want nil", exe, err)
	}
	if got := os.Getenv(qemuEnv); got != exe {
		t.Errorf("%s = %q, want %q", qemuEnv, got, exe)
	}
}
