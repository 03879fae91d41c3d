package vmfork

// Delta templates (issue 27; sharedmem/delta.go, docs/FLATPAUSE.md). A
// fork of a source that already maps a frozen file privately records its
// RAM as that file (the base, under a second name of the template's own)
// plus a sparse file of the source's private pages at the instant. Only the
// embedded driver makes them, and only for `vmfork fork` (FreezeOptions.Delta):
// its children map the base and get the delta before they run. Everything
// else that reads a template's RAM as one file either never meets a delta
// (hibernate and template save freeze without the option) or compacts it
// into a full file first (CompactRAM: export). A delta template's Paths.RAM
// does not exist until then, so nothing can read the delta as a full file
// by mistake.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

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

// removeRAMDelta removes the delta files of template id.
func (s *Store) removeRAMDelta(id string) error {
	base, pages := DeltaPaths(s.TemplatePaths(id).RAM)
	var errs []error
	for _, p := range []string{base, pages} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("template %q: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// CompactRAM makes delta template t's RAM one full file at t.Paths.RAM
// (the base with the delta's pages over it), for what reads a template's
// RAM as one file, and drops the delta: t is then an ordinary template.
// Children that map the base keep it through their mapping. A template that
// is no delta is left as it is. The caller holds t's lock, or the lock of
// the command that owns it.
func (s *Store) CompactRAM(ctx context.Context, t *Template) error {
	if t.RAMDelta == nil {
		return nil
	}
	os.Remove(t.Paths.RAM + ".tmp-compact") // a killed compaction's
	if _, err := sharedmem.CompactDelta(ctx, t.RAMDelta.Base, t.RAMDelta.Pages, t.Paths.RAM); err != nil {
		return fmt.Errorf("template %q: %w", t.ID, err)
	}
	t.RAMDelta = nil
	if err := s.WriteTemplate(t); err != nil {
		return err
	}
	return s.removeRAMDelta(t.ID)
}
