package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestStoreGone(t *testing.T) {
	state, mem := t.TempDir(), t.TempDir()
	if got := storeGone(state, mem); got != "" {
		t.Errorf("storeGone of two dirs that exist = %q, want \"\"", got)
	}
	os.Remove(mem)
	if got := storeGone(state, mem); got != mem {
		t.Errorf("storeGone with the mem dir removed = %q, want %q", got, mem)
	}
	if got := storeGone(filepath.Join(state, "none"), mem); got != filepath.Join(state, "none") {
		t.Errorf("storeGone = %q, want the missing state dir first", got)
	}
}
