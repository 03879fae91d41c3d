package vmfork

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/overlay"
)

// collectTemplates removes what no machine needs any more. A template's RAM
// and device state are needed while a child created from it exists and is not
// stopped (it maps the RAM file). Its frozen disk is read by its children's
// disk chains and by its source's (whose top was stacked on it at the fork);
// chains are read from the qcow2 headers themselves, not from records that a
// crash could have left stale. Once no child needs a template, the frozen disk
// is taken out of the remaining chains (their data is copied up) and the
// template goes.
// Templates of a fork or save in progress are left alone: their journal
// entry's process is alive (journal.go:Store.inFlightTemplates).
func (mg *Manager) collectTemplates(ctx context.Context) {
	ts, err := mg.Store.ListTemplates()
	if err != nil || len(ts) == 0 {
		return
	}
	ms, err := mg.Store.ListMachines()
	if err != nil {
		return
	}
	u, ok := mg.templateUseOf(ctx, ms)
	if !ok {
		return
	}
	needed, ok := neededDisks(ts, u)
	if !ok {
		return
	}
	busy := mg.Store.inFlightTemplates()
	for _, t := range ts {
		if busy[t.ID] {
			continue // a fork or save in progress; its repair decides if it dies
		}
		mg.collectTemplate(ctx, t, u, needed, ms)
	}
}

// templateUse is what the machines need of the templates: the children
// that map each one's RAM, the disk layers their chains read, and the
// templates that hold a machine's hibernated instant (hibernate.go).
type templateUse struct {
	users      map[string]int
	layers     map[string]bool
	hibernated map[string]bool
}

// templateUseOf reads ms's use of templates; ok is false when a disk chain
// cannot be read, and then every template stays, to be safe.
func (mg *Manager) templateUseOf(ctx context.Context, ms []*Machine) (u templateUse, ok bool) {
	u = templateUse{users: map[string]int{}, layers: map[string]bool{}, hibernated: map[string]bool{}}
	for _, m := range ms {
		mg.refresh(ctx, m)
		if m.Hibernated != "" {
			u.hibernated[m.Hibernated] = true
		}
		// A hibernated machine maps no template's RAM.
		if m.mapsTemplate() {
			u.users[m.Template]++
		}
		if m.Spec.Disk == "" {
			continue
		}
		chain, err := overlay.Chain(m.Paths.Disk)
		if err != nil {
			mg.Log.WithField("machine", m.Name).WithError(err).Debug("disk chain unreadable; keeping templates")
			return u, false
		}
		for _, l := range chain {
			u.layers[filepath.Clean(l.Path)] = true
		}
		extra, err := extraDiskChains(m)
		if err != nil {
			mg.Log.WithField("machine", m.Name).WithError(err).Debug("disk chain unreadable; keeping templates")
			return u, false
		}
		for _, l := range extra {
			u.layers[filepath.Clean(l.Path)] = true
		}
	}
	return u, true
}

// neededDisks returns the frozen disks under a template that children
// still use: that template's disk is read-only and cannot be rebased, so
// they must stay. ok is false when a chain cannot be read.
func neededDisks(ts []*Template, u templateUse) (needed map[string]bool, ok bool) {
	needed = map[string]bool{}
	for _, t := range ts {
		if (u.users[t.ID] == 0 && t.Name == "" && !u.hibernated[t.ID]) || t.Paths.Disk == "" {
			continue
		}
		chain, err := overlay.Chain(t.Paths.Disk)
		if err != nil {
			return nil, false
		}
		for _, f := range t.ownedDiskFiles() {
			more, err := overlay.Chain(f)
			if err != nil {
				return nil, false
			}
			chain = append(chain, more...)
		}
		for _, l := range chain {
			needed[filepath.Clean(l.Path)] = true
		}
	}
	return needed, true
}

// collectTemplate frees what of template t no one needs, and removes it
// when nothing of it is needed.
func (mg *Manager) collectTemplate(ctx context.Context, t *Template, u templateUse, needed map[string]bool, ms []*Machine) {
	// A foreign frozen disk is never removed (nor taken out of a chain,
	// which would copy the user's whole image): its template can go as
	// soon as no child maps its RAM.
	ownDisk := t.Paths.Disk != "" && !t.ForeignDisk
	if u.hibernated[t.ID] {
		// It stays while its machine is hibernated; a copy of its RAM
		// in the mem dir only while children map it.
		if u.users[t.ID] == 0 {
			if err := mg.Store.dropThawed(t); err != nil {
				mg.Log.WithField("template", t.ID).WithError(err).Warn("could not free template memory")
			}
		}
		return
	}
	if u.users[t.ID] == 0 {
		mg.Store.dropCompactedBase(t)
	}
	// A kept template (kept.go) stays until it is given up.
	if u.users[t.ID] > 0 || t.Name != "" {
		return
	}
	log := mg.Log.WithField("template", t.ID)
	if ownDisk && (needed[filepath.Clean(t.Paths.Disk)] || anyIn(t.ownedDiskFiles(), needed) || anyIn(t.ownedDiskFiles(), u.layers)) {
		// (An extra disk's frozen image is never taken out of a chain:
		// its template stays while a chain reads it.)
		// Later templates' disks build on this one, but no child maps
		// its RAM: free that now, the disk goes with them.
		if t.HasMemory {
			if err := mg.Store.DropTemplateMemory(t); err != nil {
				log.WithError(err).Warn("could not free template memory")
			}
		}
		return
	}
	if !ownDisk || !u.layers[filepath.Clean(t.Paths.Disk)] {
		if err := mg.Store.RemoveTemplate(t.ID); err != nil {
			log.WithError(err).Warn("could not remove unused template")
		} else {
			log.Info("removed unused template")
		}
		return
	}
	if t.HasMemory {
		if err := mg.Store.DropTemplateMemory(t); err != nil {
			log.WithError(err).Warn("could not free template memory")
		}
	}
	// Only the source's (or a sibling fork's) disk chain still reads the
	// frozen disk: take it out of those chains, then remove it.
	if mg.dropLayer(ctx, t.Paths.Disk, ms) {
		if err := mg.Store.RemoveTemplate(t.ID); err != nil {
			log.WithError(err).Warn("could not remove unused template")
		} else {
			log.Info("removed unused template")
		}
	}
}

// dropLayer takes the frozen disk layer out of every machine's chain that
// includes it: through the driver for a running machine, with qemu-img for a
// stopped one. It reports whether no chain needs the layer any more.
func (mg *Manager) dropLayer(ctx context.Context, layer string, ms []*Machine) bool {
	clear := true
	for _, m := range ms {
		if m.Spec.Disk == "" {
			continue
		}
		chain, err := overlay.Chain(m.Paths.Disk)
		if err != nil {
			return false
		}
		k := -1
		for i, l := range chain {
			if i > 0 && filepath.Clean(l.Path) == filepath.Clean(layer) {
				k = i
			}
		}
		if k < 0 {
			continue
		}
		log := mg.Log.WithFields(logrus.Fields{"machine": m.Name, "layer": layer})
		// Never under another command's feet: skip a machine that is busy.
		lctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		unlock, err := mg.Store.Lock(lctx, m.Name)
		cancel()
		if err != nil {
			clear = false
			continue
		}
		switch {
		case m.State == StateStopped:
			base := ""
			if k+1 < len(chain) {
				base = chain[k+1].Path
			}
			err = overlay.Rebase(ctx, m.Paths.Disk, base)
		case m.Driver == mg.Driver.Name():
			if d, ok := mg.Driver.(LayerDropper); ok {
				err = d.DropLayer(ctx, m, layer)
			} else {
				err = fmt.Errorf("driver %q: %w", mg.Driver.Name(), ErrUnsupported)
			}
		default:
			err = fmt.Errorf("machine belongs to driver %q", m.Driver)
		}
		unlock()
		if err != nil {
			log.WithError(err).Warn("could not take an unused template's disk out of the chain")
			clear = false
			continue
		}
		log.Info("disk chain no longer reads the template's disk")
	}
	return clear
}
