package vmfork

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// After a host restart (or a mem dir emptied under vmfork) every QEMU is
// gone and so is every RAM file in the mem dir; the state dir is whole.
// No repair by hand is needed; each command finds the truth:
//
//   - ls shows every machine that ran stopped, its reason host-restart
//     (stopreason.go); vmfork start boots each again from its disk
//     (start.go), a fork child too: it gets a RAM file of its own.
//   - A hibernated machine's RAM is on disk: resume and fork bring it back.
//   - A kept template that held RAM has lost it (TemplateRAMLost):
//     template ls says so, and a fork of it or a pool is refused in one
//     line. gc gives its name up; its disk stays while a child's disk chain
//     reads it. A live fork's template is collected as soon as no child
//     maps its RAM, as ever.

// TemplateRAMLost reports whether template t held RAM that the mem dir no
// longer has: the host restarted, or the mem dir was emptied. No child can
// start from it any more (a fork loads device state with no RAM behind
// it). A hibernated machine's template is not lost: its RAM is on disk,
// and comes back with a resume or a fork.
func TemplateRAMLost(t *Template) bool {
	if !t.HasMemory || t.Hibernation != "" || t.Paths.RAM == "" {
		return false
	}
	if d := t.RAMDelta; d != nil {
		for _, p := range append([]string{d.Base}, d.Files()...) {
			if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
				return true
			}
		}
		return false
	}
	_, err := os.Stat(t.Paths.RAM)
	return errors.Is(err, fs.ErrNotExist)
}

// checkRAMKept refuses, for verb, a kept template whose RAM was lost.
func checkRAMKept(verb string, t *Template) error {
	if !TemplateRAMLost(t) {
		return nil
	}
	name := t.Name
	if name == "" {
		name = t.ID
	}
	return fmt.Errorf("%s %q: template %s lost its RAM (%s) when the host restarted or the mem dir was emptied; "+
		"no child can start from it (vmfork gc or vmfork template rm %s gives it up): %w", verb, name, t.ID, t.Paths.RAM, name, ErrInvalid)
}

// giveUpLost gives up the names of kept templates whose RAM was lost
// (gc): they can never make a child again. Each goes once no disk chain
// reads its disk. It returns the names given up.
func (mg *Manager) giveUpLost(ctx context.Context) ([]string, error) {
	ts, err := mg.Store.ListTemplates()
	if err != nil {
		return nil, err
	}
	var gone []string
	var errs []error
	for _, t := range ts {
		if t.Name == "" || t.Driver != mg.Driver.Name() || !TemplateRAMLost(t) {
			continue
		}
		if _, err := mg.Unkeep(ctx, t.Name); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
			continue
		}
		mg.Log.WithField("template", t.Name).Info("gave up a kept template whose RAM was lost")
		gone = append(gone, t.Name)
	}
	return gone, errors.Join(errs...)
}
