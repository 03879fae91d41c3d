package vmfork

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vmfork/vmfork/templates"
)

// journalEntry records an operation in flight (a boot or a fork), so that a
// CLI killed in the middle leaves evidence the next run acts on: a source to
// resume, machines to remove that never finished starting.
type journalEntry struct {
	Op       string    `json:"op"`
	Source   string    `json:"source,omitempty"`
	Template string    `json:"template,omitempty"`
	Machines []string  `json:"machines,omitempty"` // created by the operation
	PID      int       `json:"pid"`                // the vmfork process doing it
	Started  time.Time `json:"started"`
}

// journal writes e and returns a func that removes it.
func (s *Store) journal(e journalEntry) (done func(), err error) {
	e.PID, e.Started = os.Getpid(), time.Now().UTC()
	f, err := os.CreateTemp(filepath.Join(s.StateDir, dirJournal), e.Op+"-*.json")
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	f.Close()
	path := f.Name()
	if err := writeJSON(path, e); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return func() { os.Remove(path) }, nil
}

// abandoned returns journal entries whose vmfork process is gone.
func (s *Store) abandoned() (map[string]journalEntry, error) {
	dir := filepath.Join(s.StateDir, dirJournal)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	out := map[string]journalEntry{}
	for _, de := range entries {
		var e journalEntry
		path := filepath.Join(dir, de.Name())
		if err := readJSON(path, &e); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				os.Remove(path) // a torn write from a crash: nothing to act on
			}
			continue
		}
		if !vmforkAlive(e.PID) {
			out[path] = e
		}
	}
	return out, nil
}

// vmforkAlive reports whether pid is a live process running this binary.
func vmforkAlive(pid int) bool {
	if pid == os.Getpid() {
		return true
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	self, serr := os.Executable()
	if err != nil || serr != nil {
		return false
	}
	// A zombie's exe link is gone already; Running also says so for one
	// whose link a kernel still shows.
	return bytes.Equal([]byte(exe), []byte(self)) && templates.Running(pid)
}

// Recover repairs what interrupted forks left behind: it resumes sources
// left paused and clears their journal entries. Every command that changes
// or lists machines calls it first; with nothing to repair it costs one
// directory read.
func (mg *Manager) Recover(ctx context.Context) error {
	entries, err := mg.Store.abandoned()
	if err != nil || len(entries) == 0 {
		return err
	}
	forker, _ := mg.Driver.(Forker)
	var errs []error
	for path, e := range entries {
		if src, err := mg.Store.LoadMachine(e.Source); err == nil && src.Driver == mg.Driver.Name() && forker != nil {
			if st, _ := mg.Driver.Status(ctx, src); st != StateStopped {
				if err := forker.Resume(ctx, src); err != nil {
					errs = append(errs, fmt.Errorf("resume %q after an interrupted %s: %w", e.Source, e.Op, err))
					continue
				}
				mg.Log.WithField("machine", e.Source).Warn("made sure a machine an interrupted fork had paused runs")
			}
		}
		for _, name := range e.Machines {
			m, err := mg.Store.LoadMachine(name)
			if err != nil || m.State != StateCreating || m.Driver != mg.Driver.Name() {
				continue
			}
			if err := mg.Driver.Stop(ctx, m, true); err != nil {
				errs = append(errs, fmt.Errorf("remove %q left by an interrupted %s: %w", name, e.Op, err))
				continue
			}
			mg.Store.RemoveMachine(name)
			mg.Log.WithField("machine", name).Warn("removed a machine an interrupted command left half-made")
		}
		os.Remove(path)
	}
	mg.collectTemplates(ctx)
	return errors.Join(errs...)
}
