package main

import (
	"path/filepath"
	"testing"
)

// TestOvercommitFlag: a bad --overcommit (or VMFORK_OVERCOMMIT) is bad
// input, refused before the state dir is made; a good one is taken.
func TestOvercommitFlag(t *testing.T) {
	dir := t.TempDir()
	global := []string{"--state-dir", filepath.Join(dir, "state"), "--mem-dir", filepath.Join(dir, "mem")}
	for _, v := range []string{"x", "0", "-2", "101", "NaN"} {
		if _, code := runCLI(t, append(global, "--overcommit", v, "ls")...); code != exitUsage {
			t.Errorf("--overcommit %s: exit %d, want %d", v, code, exitUsage)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 0 {
		t.Errorf("a bad --overcommit made %v", m)
	}
	t.Setenv("VMFORK_OVERCOMMIT", "lots")
	if _, code := runCLI(t, append(global, "ls")...); code != exitUsage {
		t.Errorf("VMFORK_OVERCOMMIT=lots: exit %d, want %d", code, exitUsage)
	}
	for _, v := range []string{"1", "2.5", "off"} {
		if _, code := runCLI(t, append(global, "--overcommit", v, "ls")...); code != 0 {
			t.Errorf("--overcommit %s: exit %d, want 0", v, code)
		}
	}
}
