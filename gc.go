package vmfork

import (
	"context"
	"path/filepath"

	"github.com/vmfork/vmfork/overlay"
)

// collectTemplates removes what no machine needs any more. A template's RAM
// and device state are needed while a child created from it exists and is not
// stopped (it maps the RAM file); its frozen disk is needed while it is a
// layer in any machine's disk chain, which is read from the qcow2 headers
// themselves, not from records that a crash could have left stale.
// Templates of a fork in progress are protected by their reserved children.
func (mg *Manager) collectTemplates(ctx context.Context) {
	ts, err := mg.Store.ListTemplates()
	if err != nil || len(ts) == 0 {
		return
	}
	ms, err := mg.Store.ListMachines()
	if err != nil {
		return
	}
	users := map[string]int{}
	layers := map[string]bool{}
	for _, m := range ms {
		mg.refresh(ctx, m)
		if m.Template != "" && m.State != StateStopped {
			users[m.Template]++
		}
		if m.Spec.Disk == "" {
			continue
		}
		chain, err := overlay.Chain(m.Paths.Disk)
		if err != nil {
			// Unreadable chain: keep every template, to be safe.
			mg.Log.WithField("machine", m.Name).WithError(err).Debug("disk chain unreadable; keeping templates")
			return
		}
		for _, l := range chain {
			layers[filepath.Clean(l.Path)] = true
		}
	}
	for _, t := range ts {
		if users[t.ID] > 0 {
			continue
		}
		log := mg.Log.WithField("template", t.ID)
		if t.Paths.Disk == "" || !layers[filepath.Clean(t.Paths.Disk)] {
			if err := mg.Store.RemoveTemplate(t.ID); err != nil {
				log.WithError(err).Warn("could not remove unused template")
			} else {
				log.Info("removed unused template")
			}
			continue
		}
		if t.HasMemory {
			if err := mg.Store.DropTemplateMemory(t); err != nil {
				log.WithError(err).Warn("could not free template memory")
			} else {
				log.Info("freed template memory; its disk stays as a layer")
			}
		}
	}
}
