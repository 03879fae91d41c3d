package vmfork

// Delta templates (issue 27; sharedmem/delta.go, docs/DELTAS.md). A
// fork of a source that already maps a frozen file privately records its
// RAM as that file (the base, under a second name of the template's own)
// plus a sparse file of the source's private pages at the instant. Only the
// embedded driver makes them, and only for `vmfork fork` (FreezeOptions.Delta):
// its children map the base and get the deltas of the chain, oldest first,
// before they run. Everything
// else that reads a template's RAM as one file either never meets a delta
// (hibernate and template save freeze without the option) or compacts it
// into a full file first (CompactRAM: export, push, template compact). A delta template's Paths.RAM
// does not exist until then, so nothing can read the delta as a full file
// by mistake.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/sharedmem"
)

// RAMDelta is where a delta template's RAM is: the base file and the pages
// that differ from it.
type RAMDelta struct {
	// Base is a second name of the full, frozen file the delta applies to;
	// it keeps that file as long as the template lives, whatever else
	// gives it up (gc, the base's own template going).
	Base string `json:"base"`
	// Pages is the sparse file of the pages that differ, at their offsets.
	Pages string `json:"pages"`
	// BaseOf is the name the source's mapping showed for the base (for
	// people reading the record; Base is what counts).
	BaseOf string `json:"base_of,omitempty"`
	// Bytes is how much the delta holds.
	Bytes int64 `json:"bytes"`
	// Chain is the deltas Pages applies after, oldest first: second names
	// of the template's own for the deltas of the forks before it
	// (sharedmem/chain.go), so that Pages holds only what changed since
	// the last of them. Empty: Pages stands on the base alone.
	Chain []string `json:"chain,omitempty"`
}

// Depth is how many deltas a child of the template applies.
func (d *RAMDelta) Depth() int { return len(d.Chain) + 1 }

// Files is the delta files in the order a child applies them.
func (d *RAMDelta) Files() []string {
	return append(append([]string{}, d.Chain...), d.Pages)
}

// DeltaPaths returns the names of the base and the delta of the template
// whose RAM file would be ram: beside it in the mem dir, so that the base
// can be a hard link, and derived from the template's id, so that a crashed
// freeze's leftovers are found without a record.
func DeltaPaths(ram string) (base, pages string) {
	stem := strings.TrimSuffix(ram, ramSuffix)
	return stem + ".base" + ramSuffix, stem + ".delta"
}

// MappedRAM is the file a child of t maps: the base of a delta template,
// else its RAM file.
func (t *Template) MappedRAM() string {
	if t.RAMDelta != nil {
		return t.RAMDelta.Base
	}
	return t.Paths.RAM
}

// removeRAMDelta removes the delta files of template id: its base's and
// its chain's names too (sharedmem.ChainLink), found by name, without a
// record.
func (s *Store) removeRAMDelta(id string) error {
	base, pages := DeltaPaths(s.TemplatePaths(id).RAM)
	links, _ := filepath.Glob(pages + ".*")
	var errs []error
	for _, p := range append([]string{base, pages}, links...) {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("template %q: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// CompactRAM makes delta template t's RAM one full file at t.Paths.RAM
// (the base with the chain's and the delta's pages over it), for what reads
// a template's RAM as one file, and drops the delta: t is then an ordinary
// template, whose new children share the full file and apply nothing. The
// file is written under a temporary name and renamed whole; the record
// names it only after. Children already running keep what they map: the
// base keeps its name here until gc finds no child of t mapping it
// (dropCompactedBase). A template that is no delta is left as it is. The
// caller holds t's lock, or the lock of the command that owns it.
func (s *Store) CompactRAM(ctx context.Context, t *Template) error {
	_, err := s.compactRAM(ctx, t)
	return err
}

// compactRAM is CompactRAM; it returns the bytes written.
func (s *Store) compactRAM(ctx context.Context, t *Template) (int64, error) {
	if t.RAMDelta == nil {
		return 0, nil
	}
	os.Remove(t.Paths.RAM + ".tmp-compact") // a killed compaction's
	n, err := sharedmem.CompactChain(ctx, t.RAMDelta.Base, t.RAMDelta.Files(), t.Paths.RAM)
	if err != nil {
		return n, fmt.Errorf("template %q: %w", t.ID, err)
	}
	d := t.RAMDelta
	t.RAMDelta = nil
	if err := s.WriteTemplate(t); err != nil {
		t.RAMDelta = d
		os.Remove(t.Paths.RAM)
		return n, err
	}
	var errs []error
	for _, f := range d.Files() {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("template %q: %w", t.ID, err))
		}
	}
	return n, errors.Join(errs...)
}

// dropCompactedBase removes the base's name that a compacted template (no
// delta any more) kept for the children that mapped it, once none does.
func (s *Store) dropCompactedBase(t *Template) {
	if t.RAMDelta != nil || t.Paths.RAM == "" {
		return
	}
	base, _ := DeltaPaths(t.Paths.RAM)
	os.Remove(base)
}

// DeltaStats is what a template's RAM is made of, for template ls.
type DeltaStats struct {
	// Kind is "full" (one file) or "delta" (a base and deltas).
	Kind string `json:"ram_kind"`
	// Depth is how many deltas a child applies (0 for a full file).
	Depth int `json:"chain_depth"`
	// AloneBytes is the RAM that removing the template would free now:
	// its files that no other name holds (a delta a later template's
	// chain links is held by that one too).
	AloneBytes int64 `json:"ram_alone_bytes"`
}

// deltaStats describes t's RAM (t.HasMemory).
func deltaStats(t *Template) DeltaStats {
	files := []string{t.Paths.RAM}
	st := DeltaStats{Kind: "full"}
	if d := t.RAMDelta; d != nil {
		st.Kind, st.Depth = "delta", d.Depth()
		files = append([]string{d.Base}, d.Files()...)
	}
	for _, f := range files {
		var s unix.Stat_t
		if unix.Stat(f, &s) == nil && s.Nlink == 1 {
			st.AloneBytes += s.Blocks * 512
		}
	}
	return st
}

// CompactResult is what `vmfork template compact` did.
type CompactResult struct {
	Template string `json:"template"`
	Name     string `json:"name,omitempty"`
	// Compacted is false when the template was a full file already.
	Compacted bool `json:"compacted"`
	// Depth is how many deltas it was made of (0: a full file).
	Depth        int     `json:"chain_depth"`
	WrittenBytes int64   `json:"written_bytes"`
	ElapsedMS    float64 `json:"elapsed_ms"`
}

// CompactTemplate makes template name (kept name or id)'s RAM one full
// file (CompactRAM), under the template's lock, outside any pause: the
// children it makes from then on share that file and apply nothing.
func (mg *Manager) CompactTemplate(ctx context.Context, name string) (*CompactResult, error) {
	start := time.Now()
	lockName := name
	if m := templateIDPattern.FindStringSubmatch(name); m != nil {
		lockName = m[1]
	} else if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("template compact: %w", err)
	}
	unlock, err := mg.Store.Lock(ctx, lockName)
	if err != nil {
		return nil, fmt.Errorf("template compact %q: %w", name, err)
	}
	defer unlock()
	t, err := mg.Store.findTemplate(name)
	if err != nil {
		return nil, fmt.Errorf("template compact: %w", err)
	}
	res := &CompactResult{Template: t.ID, Name: t.Name}
	if !t.HasMemory {
		return nil, fmt.Errorf("template compact %q: template %s holds only a disk (no RAM to compact): %w", name, t.ID, ErrInvalid)
	}
	if err := checkRAMKept("template compact", t); err != nil {
		return nil, err
	}
	if t.RAMDelta != nil {
		res.Depth = t.RAMDelta.Depth()
	}
	n, err := mg.Store.compactRAM(ctx, t)
	res.Compacted, res.WrittenBytes = res.Depth > 0 && err == nil, n
	res.ElapsedMS = ms(time.Since(start))
	return res, err
}
