package vmfork

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// deadPID is a PID no process has (above the kernel's pid_max).
const deadPID = 1 << 30

// abandon writes a journal entry as a killed vmfork process leaves it.
func abandon(t *testing.T, s *Store, e journalEntry) {
	t.Helper()
	e.PID, e.Started = deadPID, time.Now().UTC().Add(-time.Minute)
	if err := writeJSON(filepath.Join(s.StateDir, dirJournal, string(e.Op)+"-dead.json"), e); err != nil {
		t.Fatal(err)
	}
}

func addMachine(t *testing.T, mg *Manager, name string, st State, tpl string) {
	t.Helper()
	m := &Machine{Name: name, Driver: "fake", State: st, Paths: mg.Store.MachinePaths(name), Parent: "src", Template: tpl,
		Spec: Spec{MemoryMiB: 256, CPUs: 1}, Created: time.Now().UTC().Add(-time.Minute)}
	if err := mg.Store.CreateMachine(m); err != nil {
		t.Fatal(err)
	}
}

func pathExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// A fork killed midway: its unfinished children go, finished ones and
// another fork's stay, and the freeze's temporary RAM file goes.
func TestRecoverKilledFork(t *testing.T) {
	mg, d := newTestManager(t)
	bootFake(t, mg, "src")
	tpl, err := mg.Store.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	tpl.HasMemory = true
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	addMachine(t, mg, "src-1", StateCreating, tpl.ID)  // its identity chain never finished
	addMachine(t, mg, "src-2", StateRunning, tpl.ID)   // ready before the kill
	addMachine(t, mg, "src-3", StateCreating, "src.9") // another fork's, still in progress
	d.running["src-1"], d.running["src-2"] = true, true
	tmp := filepath.Join(mg.Store.MemDir, "."+tpl.ID+".ram.tmp")
	if err := os.WriteFile(tmp, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	abandon(t, mg.Store, journalEntry{Op: "fork", Source: "src", Template: tpl.ID, Machines: []string{"src-1", "src-2", "src-3"}})

	ms, err := mg.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range ms {
		names = append(names, m.Name+"="+string(m.State))
	}
	if got, want := strings.Join(names, ","), "src=running,src-2=running,src-3=creating"; got != want {
		t.Errorf("machines after the repair: got %s, want %s", got, want)
	}
	if d.running["src-1"] {
		t.Error("the half-made child's process was not stopped")
	}
	if pathExists(tmp) {
		t.Errorf("%s left behind", tmp)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirJournal)); n != 0 {
		t.Errorf("%d journal entries left after the repair", n)
	}
}

// A template save killed before its freeze finished leaves no kept name.
func TestRecoverKilledSave(t *testing.T) {
	mg, _ := newTestManager(t)
	bootFake(t, mg, "src")
	tpl, err := mg.Store.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	tpl.Name = "golden"
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	abandon(t, mg.Store, journalEntry{Op: "fork", Source: "src", Template: tpl.ID})
	if err := mg.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Store.FindKept("golden"); !errors.Is(err, ErrNotFound) {
		t.Errorf("FindKept after the repair = %v, want ErrNotFound", err)
	}
}

// An rm killed after its record went to the trash is finished.
func TestRecoverKilledRemove(t *testing.T) {
	mg, _ := newTestManager(t)
	addMachine(t, mg, "web", StateStopped, "")
	p := mg.Store.MachinePaths("web")
	trash := filepath.Join(mg.Store.StateDir, dirMachines, trashPrefix+"web")
	if err := os.Rename(p.Dir, trash); err != nil {
		t.Fatal(err)
	}
	if got := machineNames(t, mg.Store); got != "" {
		t.Errorf("machines with a record in the trash: %q, want none", got)
	}
	abandon(t, mg.Store, journalEntry{Op: "rm", Machines: []string{"web"}})
	if err := mg.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if pathExists(trash) {
		t.Errorf("%s left after the repair", trash)
	}
}

// An interrupted pool fill: the member being started and a member
// directory without a record go; a started member stays.
func TestRecoverKilledPoolFill(t *testing.T) {
	mg, _ := newTestManager(t)
	tpl, err := mg.Store.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	tpl.Name, tpl.HasMemory, tpl.Driver = "golden", true, "fake"
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, st := range []State{StatePooled, StateCreating, ""} {
		m, err := mg.Store.newPoolMember(tpl)
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, m.Paths.Dir)
		if st == "" {
			continue // killed before its record was written
		}
		m.State = st
		if err := mg.Store.savePoolMember(m); err != nil {
			t.Fatal(err)
		}
	}
	abandon(t, mg.Store, journalEntry{Op: "pool", Template: tpl.ID})
	if err := mg.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		if got := pathExists(dirs[i]); got != want {
			t.Errorf("member directory %s exists: %v, want %v", dirs[i], got, want)
		}
	}
}

// A new template id is free of what a command killed during a freeze into
// the same id left.
func TestNewTemplateClearsStaleFiles(t *testing.T) {
	s := newTestStore(t)
	stale := []string{filepath.Join(s.MemDir, ".src.1.ram.tmp"), filepath.Join(s.MemDir, "src.1.ram")}
	for _, f := range stale {
		if err := os.WriteFile(f, []byte("stale"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tpl, err := s.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	if tpl.ID != "src.1" {
		t.Fatalf("NewTemplate id %s, want src.1", tpl.ID)
	}
	for _, f := range stale {
		if pathExists(f) {
			t.Errorf("%s left for the new template", f)
		}
	}
}
