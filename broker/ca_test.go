package broker

import (
	"bytes"
	"crypto/ecdsa"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestCAFilesAndModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "broker")
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want os.FileMode
	}{
		{dir, 0o700},
		{filepath.Join(dir, CAKeyFile), 0o600},
		{filepath.Join(dir, CACertFile), 0o644},
	} {
		if got := mode(t, tc.path); got != tc.want {
			t.Errorf("%s: mode %#o, want %#o", tc.path, got, tc.want)
		}
	}
	c := ca.Certificate()
	if !c.IsCA || !c.MaxPathLenZero || c.MaxPathLen != 0 {
		t.Errorf("CA certificate: IsCA %v, MaxPathLen %d (zero %v); want a CA that signs no CA", c.IsCA, c.MaxPathLen, c.MaxPathLenZero)
	}
	if _, ok := c.PublicKey.(*ecdsa.PublicKey); !ok {
		t.Errorf("CA key %T, want ECDSA", c.PublicKey)
	}
	if left := time.Until(c.NotAfter); left < 9*365*24*time.Hour {
		t.Errorf("CA valid for %v, want about ten years", left)
	}
	pemFile, _ := os.ReadFile(filepath.Join(dir, CACertFile))
	if !bytes.Equal(ca.PEM(), pemFile) || bytes.Contains(ca.PEM(), []byte("PRIVATE")) {
		t.Error("PEM() is not the certificate file alone")
	}

	// Loaded again, and by concurrent callers: the same CA.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			again, err := LoadOrCreateCA(dir)
			if err != nil {
				t.Error(err)
				return
			}
			if !again.Certificate().Equal(c) {
				t.Error("a second load made another CA")
			}
		})
	}
	wg.Wait()

	// A key others can read is refused.
	if err := os.Chmod(filepath.Join(dir, CAKeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a 0644 CA key: %v, want it refused", err)
	}
}

func TestCAConcurrentCreation(t *testing.T) {
	dir := t.TempDir()
	cas := make([]*CA, 4)
	var wg sync.WaitGroup
	for i := range cas {
		wg.Go(func() {
			ca, err := LoadOrCreateCA(dir)
			if err != nil {
				t.Error(err)
			}
			cas[i] = ca
		})
	}
	wg.Wait()
	for _, ca := range cas[1:] {
		if ca == nil || cas[0] == nil || !ca.Certificate().Equal(cas[0].Certificate()) {
			t.Fatal("concurrent first loads made different CAs")
		}
	}
}
