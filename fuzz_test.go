package vmfork

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The fuzz targets check every parser of user input and of state files for
// what must hold whatever the bytes: no panic, an error that wraps ErrInvalid
// and fits on one line, and a value that survives a round trip. `make fuzz`
// runs each for a few seconds; the seeds run with every `go test`.

func FuzzParseMemory(f *testing.F) {
	for _, s := range []string{"512M", "2G", "512", "1GiB", "0", "-1", "9223372036854775807G", " 64m ", "G", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		mib, err := ParseMemory(s)
		if err != nil {
			oneLineInvalid(t, err)
			return
		}
		if mib <= 0 || mib > MaxMemoryMiB {
			t.Fatalf("ParseMemory(%q) = %d MiB with no error", s, mib)
		}
	})
}

func FuzzParsePortForward(f *testing.F) {
	for _, s := range []string{"22", "2222:22", "0:22", "22:0", "65536:22", "a:b", ":", "", "1:2:3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePortForward(s)
		if err != nil {
			oneLineInvalid(t, err)
			return
		}
		if p.Guest < 1 || p.Guest > 65535 || p.Host < 0 || p.Host > 65535 {
			t.Fatalf("ParsePortForward(%q) = %+v with no error", s, p)
		}
		if q, err := ParsePortForward(p.String()); err != nil || q != p {
			t.Fatalf("round trip of %q: %+v -> %q -> %+v, %v", s, p, p.String(), q, err)
		}
	})
}

func FuzzParseNetwork(f *testing.F) {
	for _, s := range []string{"user", "none", "bridge=br0", "network=default", "bridge=", "bridge=a/b", "tap", "user=x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseNetwork(s)
		if err != nil {
			oneLineInvalid(t, err)
			return
		}
		if strings.ContainsAny(n.Name, "/ \t\n") || len(n.Name) > 15 {
			t.Fatalf("ParseNetwork(%q) accepted name %q", s, n.Name)
		}
	})
}

func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"web", "web-1", "", "..", "a/b", "UPPER", strings.Repeat("a", 64)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if err := ValidateName(s); err != nil {
			oneLineInvalid(t, err)
			return
		}
		if strings.ContainsAny(s, "/\x00") || s == "." || s == ".." || len(s) > 63 {
			t.Fatalf("ValidateName accepted %q", s)
		}
	})
}

// FuzzMachineRecord feeds machine.json and manifest.json bytes through the
// store's reader: a corrupted record is an error naming the file, never a
// panic.
func FuzzMachineRecord(f *testing.F) {
	good, _ := json.Marshal(&Machine{Name: "web", Driver: "qemu", State: StateRunning, Spec: Spec{MemoryMiB: 256, CPUs: 1}})
	f.Add(good)
	f.Add([]byte(`{"name":"web","spec":{"memory_mib":-1}}`))
	f.Add([]byte(`{"name":`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := OpenStore(t.TempDir(), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		writeRecord(t, s, "web", data)
		if _, err := s.LoadMachine("web"); err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("LoadMachine error spans lines: %q", err)
		}
		writeTemplateRecord(t, s, "t1", data)
		if _, err := s.LoadTemplate("t1"); err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("LoadTemplate error spans lines: %q", err)
		}
	})
}

func oneLineInvalid(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("error %q does not wrap ErrInvalid", err)
	}
	if strings.ContainsAny(err.Error(), "\n\r") {
		t.Fatalf("error spans lines: %q", err)
	}
}

func writeRecord(t *testing.T, s *Store, name string, data []byte) {
	t.Helper()
	dir := filepath.Join(s.StateDir, dirMachines, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fileMachine), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeTemplateRecord(t *testing.T, s *Store, id string, data []byte) {
	t.Helper()
	dir := filepath.Join(s.StateDir, dirTemplates, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fileManifest), data, 0o600); err != nil {
		t.Fatal(err)
	}
}
