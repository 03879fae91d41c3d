package qemudrv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConsoleTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serial.log")
	log := "SeaBIOS\r\n\x1b[2Jbooting\r\n\r\n" + strings.Repeat("x", 300) + "\r\n" +
		"VFS: Unable to mount root fs on unknown-block(0,0)\r\n" +
		"Kernel panic - not syncing: VFS: Unable to mount root fs\r\n"
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got := consoleTail(path, 3)
	want := strings.Repeat("x", 160) + "... | VFS: Unable to mount root fs on unknown-block(0,0) | Kernel panic - not syncing: VFS: Unable to mount root fs"
	if got != want {
		t.Errorf("consoleTail = %q, want %q", got, want)
	}
	if got := consoleTail(filepath.Join(t.TempDir(), "none"), 3); got != "" {
		t.Errorf("consoleTail of a missing file = %q, want empty", got)
	}
}
