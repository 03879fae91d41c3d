package mcpserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/vmfork/vmfork"
)

// What the agent made is kept in <state-dir>/mcp/<agent>.json, written
// before each call that makes something (an entry per name the call will
// make, pending) and after it (the entries of what exists, with the
// record's creation time). A server killed between the two leaves pending
// entries; the next one settles them from the records (settle). A name is
// the agent's only while its record's creation time is the one noted, so
// a machine of the same name made later by someone else is not taken for
// the agent's.

// ownedEntry is one machine or checkpoint the agent made.
type ownedEntry struct {
	// Kind is "machine" or "checkpoint" (a kept template).
	Kind string `json:"kind"`
	// Created is the machine's record's creation time, or the template's;
	// zero while pending.
	Created time.Time `json:"created,omitzero"`
	// Since is when the call that makes it began: a pending entry is the
	// agent's only if the record is newer.
	Since time.Time `json:"since"`
	// Machine is a checkpoint's machine: it goes when the machine does.
	Machine string `json:"machine,omitempty"`
}

// owned is the agent's ownership file, guarded by mu.
type owned struct {
	mu      sync.Mutex
	path    string
	store   *vmfork.Store
	entries map[string]ownedEntry
	// reserved counts machines of calls in flight, so that two calls at
	// once cannot pass max-machines together.
	reserved int
	// inflight are the names calls in flight will make: settle keeps
	// their pending entries although no record exists yet.
	inflight map[string]bool
}

func openOwned(store *vmfork.Store, agent string) (*owned, error) {
	o := &owned{path: filepath.Join(store.StateDir, "mcp", agent+".json"), store: store, entries: map[string]ownedEntry{}, inflight: map[string]bool{}}
	if err := os.MkdirAll(filepath.Dir(o.path), 0o700); err != nil {
		return nil, fmt.Errorf("agent %q: ownership file: %w", agent, err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.update(o.settle); err != nil {
		return nil, fmt.Errorf("agent %q: %w", agent, err)
	}
	return o, nil
}

// load replaces the entries with the file's, keeping this server's
// pending ones. Callers hold mu.
func (o *owned) load() error {
	fresh := map[string]ownedEntry{}
	data, err := os.ReadFile(o.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("ownership file: %w", err)
	default:
		if err := json.Unmarshal(data, &fresh); err != nil {
			return fmt.Errorf("ownership file %s: %w", o.path, err)
		}
	}
	for name := range o.inflight {
		if e, ok := o.entries[name]; ok {
			fresh[name] = e
		}
	}
	o.entries = fresh
	return nil
}

// update runs fn on the entries as the file holds them now and writes them
// back, under an flock of <file>.lock: two servers of one agent (a
// restarted one while the old one ends) do not drop each other's entries.
// Callers hold mu.
func (o *owned) update(fn func()) error {
	f, err := os.OpenFile(o.path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("ownership file lock: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("ownership file lock: %w", err)
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if err := o.load(); err != nil {
		return err
	}
	fn()
	return o.save()
}

func (o *owned) save() error {
	data, err := json.MarshalIndent(o.entries, "", "  ")
	if err != nil {
		return err
	}
	return vmfork.WriteFileAtomic(o.path, data, 0o600)
}

// created returns the creation time of machine or kept template name,
// and whether it exists.
func (o *owned) created(kind, name string) (time.Time, bool) {
	if kind == "checkpoint" {
		t, err := o.store.FindKept(name)
		if err != nil {
			return time.Time{}, false
		}
		return t.Created, true
	}
	m, err := o.store.LoadMachine(name)
	if err != nil {
		return time.Time{}, false
	}
	return m.Created, true
}

// settle drops entries whose machine or template is gone or is another
// one now, and fills in the creation time of pending ones that exist.
// Callers hold mu.
func (o *owned) settle() {
	for name, e := range o.entries {
		if o.inflight[name] {
			continue
		}
		c, ok := o.created(e.Kind, name)
		switch {
		case !ok:
			delete(o.entries, name)
		case e.Created.IsZero() && !c.Before(e.Since):
			e.Created = c
			o.entries[name] = e
		case !c.Equal(e.Created):
			delete(o.entries, name)
		}
	}
}

// owns reports whether the agent made machine (or, kind "checkpoint", kept
// template) name and it is still that one.
func (o *owned) owns(kind, name string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.load(); err != nil {
		return false
	}
	e, ok := o.entries[name]
	if !ok || e.Kind != kind {
		return false
	}
	c, exists := o.created(kind, name)
	if !exists {
		return false
	}
	if e.Created.IsZero() {
		return !c.Before(e.Since)
	}
	return c.Equal(e.Created)
}

// checkpoints returns the agent's checkpoints and the machine of each.
func (o *owned) checkpoints() map[string]string {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.load()
	out := map[string]string{}
	for name, e := range o.entries {
		if e.Kind == "checkpoint" {
			out[name] = e.Machine
		}
	}
	return out
}

// reserve checks that n more machines fit under max and notes names as
// pending; the returned release settles them once the call is over.
func (o *owned) reserve(n, max int, names []string, kind, machine string) (release func(), err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var refused error
	err = o.update(func() {
		o.settle()
		held := 0
		for _, e := range o.entries {
			if e.Kind == "machine" {
				held++
			}
		}
		if kind == "machine" && held+o.reserved+n > max {
			refused = limitErr("max-machines", "the agent holds %d machines (%d more being made) and asks for %d more; the operator allows %d", held, o.reserved, n, max)
			return
		}
		since := time.Now()
		for _, name := range names {
			if _, taken := o.entries[name]; taken {
				continue
			}
			o.entries[name] = ownedEntry{Kind: kind, Since: since, Machine: machine}
			o.inflight[name] = true
		}
	})
	if refused != nil {
		return nil, refused
	}
	if err != nil {
		return nil, fmt.Errorf("agent ownership file: %w", err)
	}
	if kind == "machine" {
		o.reserved += n
	}
	return func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if kind == "machine" {
			o.reserved -= n
		}
		// The entries first, as pending ones of a call in flight; then
		// they are no longer, and settle fills in or drops each.
		o.update(func() {
			for _, name := range names {
				delete(o.inflight, name)
			}
			o.settle()
		})
	}, nil
}

// forget drops name.
func (o *owned) forget(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.update(func() { delete(o.entries, name) })
}
