package templates

import (
	"os"
	"path/filepath"
	"testing"
)

func TestAlive(t *testing.T) {
	self := os.Getpid()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if !Alive(self, filepath.Base(exe)) {
		t.Errorf("Alive(self, own binary name) = false, want true")
	}
	if Alive(self, "no-such-marker-in-argv") {
		t.Errorf("Alive(self, foreign marker) = true, want false: a reused PID must not count")
	}
	if Alive(0, "") {
		t.Errorf("Alive(0) = true, want false")
	}
}

func TestFreePort(t *testing.T) {
	p, err := FreePort(0)
	if err != nil || p == 0 {
		t.Fatalf("FreePort(0) = %d, %v; want a port", p, err)
	}
}
