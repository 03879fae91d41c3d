package vmfork

import (
	"context"
	"errors"
)

// forkMode is what a fork starts from.
type forkMode int

const (
	// forkLive: a running source is frozen and its children continue
	// from that instant.
	forkLive forkMode = iota + 1
	// forkStopped: a stopped source's disk is frozen and its children
	// boot from it.
	forkStopped
	// forkKept: the children come from a kept template; nothing is
	// paused (kept.go).
	forkKept
	// forkHibernated: the source is hibernated; hibernate.go forks it.
	forkHibernated
)

// forkPlan is a fork resolved and validated once, before anything is
// created or paused, and handed to each step: the steps neither reload the
// source nor re-check the request.
type forkPlan struct {
	req    ForkRequest
	forker Forker
	mode   forkMode
	// source is the source's record (refreshed from the driver); for
	// forkKept one rebuilt from the template, which the children copy.
	source *Machine
	// adopted: the source was adopted for this fork (adopt.go) and leaves
	// no record when no child comes of it.
	adopted bool
	// tpl is the kept template (forkKept), else the one prepareFork made.
	tpl   *Template
	names []string
}

// live reports whether the children load the template's saved state
// rather than boot: a running source's, or a kept template holding memory.
func (p *forkPlan) live() bool {
	return p.mode == forkLive || (p.mode == forkKept && p.tpl.HasMemory)
}

// planFork resolves req's source (a machine, a kept template, a hibernated
// machine, or a foreign one the driver adopts) and validates the request.
// The caller holds the lock of req.Source. For forkHibernated only the mode
// is set: hibernate.go resolves the rest.
func (mg *Manager) planFork(ctx context.Context, forker Forker, req ForkRequest) (*forkPlan, error) {
	p := &forkPlan{req: req, forker: forker}
	m, err := mg.Store.LoadMachine(req.Source)
	switch {
	case errors.Is(err, ErrNotFound):
		if t, kerr := mg.Store.FindKept(req.Source); kerr == nil {
			return p, mg.planKept(ctx, p, t)
		}
	case err == nil && m.State == StateHibernated:
		p.mode = forkHibernated
		return p, nil
	case err == nil:
		mg.refresh(ctx, m)
	}
	if p.source, p.names, p.adopted, err = mg.checkFork(ctx, req, m, err); err != nil {
		return nil, err
	}
	p.mode = forkStopped
	if p.source.State == StateRunning {
		p.mode = forkLive
	}
	return p, nil
}

// childMode is how a child's QEMU gets going.
type childMode int

const (
	// childLoad: a new QEMU loads the template's saved state
	// (Forker.StartChild).
	childLoad childMode = iota + 1
	// childFromPool: a warm-pool member, started ahead, loads it
	// (Pooler.Complete).
	childFromPool
	// childBoot: the child boots from an overlay on the template's disk.
	childBoot
)

// childStart is one child of a fork for startChild.
type childStart struct {
	tpl   *Template
	child *Machine
	index int // from 1, within its fork
	mode  childMode
	// member is the warm-pool process to start from (childFromPool only).
	member   *Machine
	identity IdentityOptions
}

// live reports whether the child continues from the template's state.
func (cs childStart) live() bool { return cs.mode != childBoot }
