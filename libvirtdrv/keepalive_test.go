//go:build cgo

package libvirtdrv

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestConnectBounded: a daemon that accepts and never answers fails the
// connection after the bound, naming the call, instead of hanging.
func TestConnectBounded(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "libvirt-sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c // never read: no answer
		}
	}()
	defer func() {
		for len(held) > 0 {
			(<-held).Close()
		}
	}()
	start := time.Now()
	d, err := Connect("qemu:///system?socket="+sock, nil, Options{CallTimeout: 300 * time.Millisecond})
	if err == nil {
		d.Close()
		t.Fatal("Connect to a daemon that never answers succeeded")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Connect took %v, want about the 300ms bound", took)
	}
	if !strings.Contains(err.Error(), "virConnectOpen: no answer from libvirt within 300ms") {
		t.Errorf("error %q does not name virConnectOpen and the bound", err)
	}
}

func TestNewTimeoutEnv(t *testing.T) {
	t.Setenv(TimeoutEnv, "soon")
	if _, err := New("test:///default", nil); err == nil || !strings.Contains(err.Error(), TimeoutEnv) {
		t.Errorf("New with %s=soon: %v, want an error naming it", TimeoutEnv, err)
	}
	t.Setenv(TimeoutEnv, "5s")
	d, err := New("test:///default", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.callTimeout != 5*time.Second {
		t.Errorf("call timeout %v, want 5s", d.callTimeout)
	}
}
