package vmfork

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func newTestStore(t *testing.T) *Store {
	t.Helper()
	dir := t.TempDir()
	s, err := OpenStore(filepath.Join(dir, "state"), filepath.Join(dir, "mem"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStoreMachineLifecycle(t *testing.T) {
	s := newTestStore(t)
	m := &Machine{Name: "web", Driver: "qemu", State: StateCreating, Spec: Spec{MemoryMiB: 256, CPUs: 1}, Paths: s.MachinePaths("web")}
	if err := s.CreateMachine(m); err != nil {
		t.Fatalf("CreateMachine: %v", err)
	}
	if err := s.CreateMachine(m); !errors.Is(err, ErrExists) {
		t.Fatalf("second CreateMachine = %v, want ErrExists", err)
	}
	m.State, m.PID = StateRunning, 42
	if err := s.SaveMachine(m); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadMachine("web")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateRunning || got.PID != 42 || got.Paths.QMP != m.Paths.QMP {
		t.Errorf("LoadMachine = %+v, want state running pid 42 qmp %s", got, m.Paths.QMP)
	}
	// A stray directory without a record is not listed.
	if err := os.Mkdir(filepath.Join(s.StateDir, dirMachines, "half"), 0o700); err != nil {
		t.Fatal(err)
	}
	ms, err := s.ListMachines()
	if err != nil || len(ms) != 1 || ms[0].Name != "web" {
		t.Fatalf("ListMachines = %v, %v; want [web]", ms, err)
	}
	if err := os.WriteFile(m.Paths.RAM, []byte("ram"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveMachine("web"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{m.Paths.Dir, m.Paths.RAM} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after RemoveMachine, %s: stat error %v, want not exist", p, err)
		}
	}
	if _, err := s.LoadMachine("web"); !errors.Is(err, ErrNotFound) {
		t.Errorf("LoadMachine after remove = %v, want ErrNotFound", err)
	}
}

func TestStoreRejectsBadNames(t *testing.T) {
	s := newTestStore(t)
	for _, n := range []string{"../x", "", "UPPER"} {
		if _, err := s.LoadMachine(n); !errors.Is(err, ErrInvalid) {
			t.Errorf("LoadMachine(%q) = %v, want ErrInvalid", n, err)
		}
		if err := s.RemoveMachine(n); !errors.Is(err, ErrInvalid) {
			t.Errorf("RemoveMachine(%q) = %v, want ErrInvalid", n, err)
		}
	}
	entries, _ := os.ReadDir(filepath.Dir(s.StateDir))
	if len(entries) != 2 {
		t.Errorf("store parent holds %d entries, want only state and mem", len(entries))
	}
}

func TestStoreLock(t *testing.T) {
	s := newTestStore(t)
	unlock, err := s.Lock(t.Context(), "web")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
	defer cancel()
	if _, err := s.Lock(ctx, "web"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Lock = %v, want deadline exceeded while held", err)
	}
	unlock()
	unlock2, err := s.Lock(t.Context(), "web")
	if err != nil {
		t.Fatalf("Lock after unlock: %v", err)
	}
	unlock2()
}

func TestOpenStoreMakesTopDirsPrivate(t *testing.T) {
	state, mem := filepath.Join(t.TempDir(), "state"), filepath.Join(t.TempDir(), "mem")
	for _, d := range []string{state, mem} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o755) // whatever the umask
	}
	if _, err := OpenStore(state, mem); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{state, mem} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if perm := st.Mode().Perm(); perm&0o066 != 0 {
			t.Errorf("%s is %04o after OpenStore: group and others may still read it", d, perm)
		}
	}
}
