package vmfork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qmp"
)

// fakeDriver is a Driver and Forker that runs nothing. It records calls and
// fails where told to.
type fakeDriver struct {
	mu            sync.Mutex
	running       map[string]bool
	paused        map[string]bool
	freezeErr     error
	startFail     map[string]bool // StartChild fails for these children
	resumed       []string
	stoppedPaused []string // machines stopped while paused
	freezeSeen    int
	switched      []string // SwitchDisks' sources
	switchErr     error
}

func newFakeDriver() *fakeDriver {
	return &fakeDriver{running: map[string]bool{}, paused: map[string]bool{}, startFail: map[string]bool{}}
}

func (d *fakeDriver) Name() string { return "fake" }

func (d *fakeDriver) Start(ctx context.Context, m *Machine) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.running[m.Name] = true
	m.PID = 1000 + len(d.running)
	return nil
}

func (d *fakeDriver) Stop(ctx context.Context, m *Machine, force bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.paused[m.Name] {
		d.stoppedPaused = append(d.stoppedPaused, m.Name)
	}
	delete(d.running, m.Name)
	delete(d.paused, m.Name) // its QEMU is gone
	return nil
}

func (d *fakeDriver) Status(ctx context.Context, m *Machine) (State, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.paused[m.Name]:
		return StatePaused, nil
	case d.running[m.Name]:
		return StateRunning, nil
	}
	return StateStopped, nil
}

func (d *fakeDriver) Agent(ctx context.Context, m *Machine) (*qmp.Agent, error) {
	return nil, errors.New("fake driver has no agent")
}

func (d *fakeDriver) Freeze(ctx context.Context, src *Machine, t *Template, opts FreezeOptions) (FreezeResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.freezeSeen++
	if opts.LeavePaused {
		d.paused[src.Name] = true // until Resume, as QEMU's would be
	}
	if d.freezeErr != nil {
		if errors.Is(d.freezeErr, ErrStillPaused) {
			d.paused[src.Name] = true
		}
		return FreezeResult{}, d.freezeErr
	}
	if t.Paths.RAM != "" {
		// The frozen RAM file, as a driver's freeze leaves it: a template
		// without one lost its RAM (restart.go).
		if err := os.WriteFile(t.Paths.RAM, nil, 0o400); err != nil {
			return FreezeResult{}, err
		}
	}
	return FreezeResult{}, nil
}

func (d *fakeDriver) StartChild(ctx context.Context, c *Machine, t *Template) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.startFail[c.Name] {
		return fmt.Errorf("injected start failure")
	}
	d.running[c.Name] = true
	return nil
}

func (d *fakeDriver) Resume(ctx context.Context, m *Machine) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.paused, m.Name)
	d.resumed = append(d.resumed, m.Name)
	return nil
}

// SwitchDisks implements DiskForker as QEMU's transaction leaves the
// files: src's top image gets the template's name too, and src goes onto
// a new overlay on it. switchErr makes it fail with nothing switched.
func (d *fakeDriver) SwitchDisks(ctx context.Context, src *Machine, t *Template) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.switched = append(d.switched, src.Name)
	if d.switchErr != nil {
		return d.switchErr
	}
	next, err := overlay.NextTop(filepath.Dir(src.Paths.Disk))
	if err != nil {
		return err
	}
	if err := os.Link(src.Paths.Disk, t.Paths.Disk); err != nil {
		return err
	}
	if err := overlay.Create(ctx, t.Paths.Disk, next); err != nil {
		return err
	}
	src.Paths.Disk = next
	return nil
}

// SetLink implements LinkSetter, which a live fork needs before it pauses
// anything; linkDriver records the calls.
func (d *fakeDriver) SetLink(context.Context, *Machine, bool) error { return nil }

func newTestManager(t *testing.T) (*Manager, *fakeDriver) {
	t.Helper()
	d := newFakeDriver()
	return NewManager(newTestStore(t), d, nil), d
}

// bootFake boots a diskless fake machine.
func bootFake(t *testing.T, mg *Manager, name string) {
	t.Helper()
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Boot(t.Context(), BootRequest{Name: name, Spec: Spec{Kernel: kernel, MemoryMiB: 256, CPUs: 1}}); err != nil {
		t.Fatal(err)
	}
}

func machineNames(t *testing.T, s *Store) string {
	t.Helper()
	ms, err := s.ListMachines()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range ms {
		names = append(names, m.Name)
	}
	return strings.Join(names, ",")
}

func dirEntries(t *testing.T, dir string) int {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

func TestForkRefusesBadRequestsBeforeFreezing(t *testing.T) {
	mg, d := newTestManager(t)
	bootFake(t, mg, "src")
	bootFake(t, mg, "taken")
	cases := []ForkRequest{
		{Source: "src", Count: 0},
		{Source: "src", Count: 3, MaxChildren: 2},
		{Source: "src", Names: []string{"taken"}},
		{Source: "src", Names: []string{"a", "a"}},
		{Source: "src", Names: []string{"src"}},
		{Source: "src", Names: []string{"a", "b"}, Count: 3},
		{Source: "src", Names: []string{"UPPER"}},
		{Source: "nope", Count: 1},
	}
	for _, req := range cases {
		if _, err := mg.Fork(t.Context(), req); err == nil {
			t.Errorf("Fork(%+v) succeeded, want an error", req)
		}
	}
	if d.freezeSeen != 0 {
		t.Errorf("a refused fork froze the source %d times", d.freezeSeen)
	}
	if got := machineNames(t, mg.Store); got != "src,taken" {
		t.Errorf("machines = %s, want src,taken", got)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirTemplates)); n != 0 {
		t.Errorf("%d templates left by refused forks", n)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirJournal)); n != 0 {
		t.Errorf("%d journal entries left by refused forks", n)
	}
}

func TestForkDefaultNamesSkipTakenOnes(t *testing.T) {
	mg, _ := newTestManager(t)
	bootFake(t, mg, "src")
	bootFake(t, mg, "src-2")
	names, err := mg.childNames(ForkRequest{Source: "src", Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names, ","); got != "src-1,src-3,src-4" {
		t.Errorf("names = %s, want src-1,src-3,src-4", got)
	}
	names, err = mg.childNames(ForkRequest{Source: "src", Count: 2, Prefix: "try"})
	if err != nil || strings.Join(names, ",") != "try-1,try-2" {
		t.Errorf("names with a prefix = %v, %v; want try-1,try-2", names, err)
	}
}

func TestForkFreezeFailureChangesNothing(t *testing.T) {
	mg, d := newTestManager(t)
	bootFake(t, mg, "src")
	d.freezeErr = errors.New("injected freeze failure")
	_, err := mg.Fork(t.Context(), ForkRequest{Source: "src", Count: 2})
	if err == nil || !strings.Contains(err.Error(), "injected freeze failure") {
		t.Fatalf("Fork = %v, want the freeze failure", err)
	}
	if got := machineNames(t, mg.Store); got != "src" {
		t.Errorf("machines = %s, want src only", got)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirTemplates)); n != 0 {
		t.Errorf("%d templates left", n)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirJournal)); n != 0 {
		t.Errorf("%d journal entries left", n)
	}
}

// A source that could not be resumed keeps its journal entry, and the next
// command resumes it.
func TestForkStillPausedIsRepairedByTheNextCommand(t *testing.T) {
	mg, d := newTestManager(t)
	bootFake(t, mg, "src")
	d.freezeErr = fmt.Errorf("resume: boom: %w", ErrStillPaused)
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "src", Count: 1}); !errors.Is(err, ErrStillPaused) {
		t.Fatalf("Fork = %v, want ErrStillPaused", err)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirJournal)); n != 1 {
		t.Fatalf("%d journal entries, want the evidence kept", n)
	}
	// The journal names this process, which is alive: nothing to repair yet.
	if err := mg.Recover(t.Context()); err != nil || len(d.resumed) != 0 {
		t.Fatalf("Recover while the forking process lives: resumed %v, err %v", d.resumed, err)
	}
	// Pretend the process died.
	entries, _ := os.ReadDir(filepath.Join(mg.Store.StateDir, dirJournal))
	path := filepath.Join(mg.Store.StateDir, dirJournal, entries[0].Name())
	var e journalEntry
	if err := readJSON(path, &e); err != nil {
		t.Fatal(err)
	}
	e.PID = 1 << 30
	if err := writeJSON(path, e); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.List(t.Context()); err != nil {
		t.Fatal(err)
	}
	if strings.Join(d.resumed, ",") != "src" {
		t.Errorf("resumed %v after the forking process died, want src", d.resumed)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirJournal)); n != 0 {
		t.Errorf("%d journal entries left after the repair", n)
	}
}

func TestForkAllChildrenFail(t *testing.T) {
	mg, d := newTestManager(t)
	bootFake(t, mg, "src")
	d.startFail["src-1"], d.startFail["src-2"] = true, true
	res, err := mg.Fork(t.Context(), ForkRequest{Source: "src", Count: 2})
	if err == nil || errors.Is(err, ErrPartial) {
		t.Fatalf("Fork = %v, want a plain failure", err)
	}
	if res == nil || len(res.Failed) != 2 || len(res.Children) != 0 {
		t.Fatalf("result = %+v, want two failures", res)
	}
	if got := machineNames(t, mg.Store); got != "src" {
		t.Errorf("machines = %s, want src only", got)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirTemplates)); n != 0 {
		t.Errorf("%d templates left with no child", n)
	}
}
