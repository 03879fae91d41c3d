package vmfork

import (
	"context"
	"errors"
	"fmt"
	"github.com/vmfork/vmfork/contract"
	"slices"

	"github.com/vmfork/vmfork/customize"
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
	// forkHibernated: the children come from a hibernated machine's
	// template, whose RAM is brought back from disk first; the machine
	// stays hibernated (hibernate.go).
	forkHibernated
	// forkDiskOnly: a running source's disks are frozen with its guest's
	// filesystems, its vCPUs never stop, and its children boot fresh from
	// them (diskonly.go).
	forkDiskOnly
)

// forkPlan is a fork resolved and validated once, before anything is
// created or paused, and handed to each step: the steps neither reload the
// source nor re-check the request.
type forkPlan struct {
	req    ForkRequest
	forker Forker
	mode   forkMode
	// source is the source's record (refreshed from the driver); for
	// forkKept and forkHibernated one rebuilt from the template, which the
	// children copy.
	source *Machine
	// adopt: the source is a machine vmfork did not make, which the
	// driver can fork (adopt.go); the apply records it first.
	adopt bool
	// hibernated is the hibernated machine (forkHibernated).
	hibernated *Machine
	// tpl is the kept or hibernated template, else the one prepareFork
	// makes in the apply.
	tpl *Template
	// children are the children's names and hostnames, in order.
	children []PlannedChild
	// contract is the children's: the request's, or inherited.
	contract *contract.Contract
	// admission is what the fork will take of the host (admission.go).
	admission *Admission
}

// names returns the children's names.
func (p *forkPlan) names() []string {
	out := make([]string, len(p.children))
	for i, c := range p.children {
		out[i] = c.Name
	}
	return out
}

// live reports whether the children load the template's saved state
// rather than boot: a running source's, or a kept template holding memory.
func (p *forkPlan) live() bool {
	switch p.mode {
	case forkLive:
		return true
	case forkKept, forkHibernated:
		return p.tpl.HasMemory || p.req.incoming != nil
	}
	return false
}

// planFork resolves req's source (a machine, a kept template, a hibernated
// machine, or a foreign one the driver can adopt), takes its lock in l,
// validates the request and admits it: the host must have room for what
// the children and the freeze will take (admission.go). It changes nothing.
func (mg *Manager) planFork(ctx context.Context, req ForkRequest, l *lockSet) (*forkPlan, error) {
	p, err := mg.resolveFork(ctx, req, l)
	if err != nil {
		return nil, err
	}
	if p.admission, err = mg.admit(mg.forkDemand(p)); err != nil {
		return nil, err
	}
	return p, nil
}

// resolveFork is planFork but for admission.
func (mg *Manager) resolveFork(ctx context.Context, req ForkRequest, l *lockSet) (*forkPlan, error) {
	forker, ok := mg.Driver.(Forker)
	if !ok {
		return nil, fmt.Errorf("fork %q: driver %q: %w", req.Source, mg.Driver.Name(), ErrUnsupported)
	}
	if err := ValidateName(req.Source); err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	if err := l.take(ctx, req.Source); err != nil {
		return nil, fmt.Errorf("fork %q: %w", req.Source, err)
	}
	p := &forkPlan{req: req, forker: forker}
	m, err := mg.Store.LoadMachine(req.Source)
	switch {
	case errors.Is(err, ErrNotFound):
		if t, kerr := mg.Store.FindKept(req.Source); kerr == nil {
			if req.DiskOnly {
				return nil, fmt.Errorf("fork %q: --disk-only forks a running machine, and this is kept template %s (its children boot or continue from it without the flag): %w", req.Source, t.ID, ErrInvalid)
			}
			return p, mg.planKept(ctx, p, t)
		}
		// A machine vmfork did not make, such as an existing libvirt
		// domain, can be forked when the driver can adopt it (adopt.go).
		if a, ok := mg.Driver.(Adopter); ok {
			if m, err = mg.inspectAdoption(ctx, a, req.Source); err == nil {
				p.adopt = true
			}
		}
	case err == nil && m.State == StateHibernated:
		if req.DiskOnly {
			return nil, fmt.Errorf("fork %q: --disk-only forks a running machine, and it is hibernated: %w", req.Source, ErrInvalid)
		}
		return p, mg.planHibernatedFork(ctx, p, m)
	case err == nil:
		mg.refresh(ctx, m)
	}
	if err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	if err := mg.checkForkSource(ctx, m); err != nil {
		return nil, err
	}
	if err := mg.checkForkDisks(m, req.DiskPolicies); err != nil {
		return nil, err
	}
	p.source = m
	p.mode = forkStopped
	if m.State == StateRunning {
		p.mode = forkLive
	}
	if req.DiskOnly {
		if err := mg.planDiskOnly(ctx, p, m); err != nil {
			return nil, err
		}
	}
	if err := mg.planChildren(p, m.Name); err != nil {
		return nil, err
	}
	return p, mg.planContract(ctx, p, m.Contract)
}

// planContract gives plan p's children their contract (the request's, or
// from, their source's or template's) and refuses one the driver cannot
// enforce on them.
func (mg *Manager) planContract(ctx context.Context, p *forkPlan, from *contract.Contract) error {
	p.contract = inheritedContract(p.req.Contract, from)
	return mg.checkContract(ctx, "fork", p.req.Source, p.source, p.contract)
}

// checkForkSource validates source machine src of a fork.
func (mg *Manager) checkForkSource(ctx context.Context, src *Machine) error {
	if src.Driver != mg.Driver.Name() {
		return fmt.Errorf("fork %q: machine belongs to driver %q: %w", src.Name, src.Driver, ErrInvalid)
	}
	if src.Adopted != nil && src.State != StateRunning {
		// The children of a stopped source boot from its record, which
		// holds little of an adopted machine's own definition.
		return fmt.Errorf("fork %q: an adopted machine is forked only while it runs, and it is %s: %w", src.Name, src.State, ErrInvalid)
	}
	if src.State != StateRunning && src.State != StateStopped {
		return fmt.Errorf("fork %q: machine is %s: %w", src.Name, src.State, ErrInvalid)
	}
	if src.State == StateRunning {
		// Children of a running source wake with its MAC: the identity
		// chain keeps their link down (identity.go). A driver that cannot
		// do that fails here, before the source is paused.
		if _, ok := mg.Driver.(LinkSetter); !ok {
			return fmt.Errorf("fork %q: driver %q cannot set a NIC link: %w", src.Name, mg.Driver.Name(), ErrUnsupported)
		}
	}
	// The children go where the source's NIC is: a bridge or libvirt
	// network gone since the source started fails here, not after a pause.
	if nc, ok := mg.Driver.(NetworkChecker); ok {
		if err := nc.CheckNetwork(ctx, src); err != nil {
			return fmt.Errorf("fork %q: %w", src.Name, err)
		}
	}
	return nil
}

// planKept completes plan p of a fork of kept template t: it checks the
// template and the request before any child is reserved.
func (mg *Manager) planKept(ctx context.Context, p *forkPlan, t *Template) error {
	if err := checkRAMKept("fork", t); err != nil {
		return err
	}
	// A template copied from another host, or kept across an upgrade of
	// QEMU, is refused here, before any child is reserved (compat.go).
	if err := mg.CheckTemplate(ctx, t); err != nil {
		return fmt.Errorf("fork %q: %w", p.req.Source, err)
	}
	if len(p.req.DiskPolicies) > 0 {
		// Its disks were frozen, or not, when it was saved.
		return fmt.Errorf("fork %q: --disk-policy applies to a fork of a machine; template %s's disk policies were set when it was saved: %w", p.req.Source, t.ID, ErrInvalid)
	}
	p.mode, p.tpl = forkKept, t
	p.source = &Machine{Name: t.Source, Driver: t.Driver, Accel: t.Accel, Spec: t.Spec}
	if err := mg.planChildren(p, t.Source); err != nil {
		return err
	}
	return mg.planContract(ctx, p, t.Contract)
}

// planHibernatedFork completes plan p of a fork of hibernated machine m:
// the children are a kept template's, of m's hibernation template.
func (mg *Manager) planHibernatedFork(ctx context.Context, p *forkPlan, m *Machine) error {
	t, err := mg.Store.LoadTemplate(m.Hibernated)
	if err != nil {
		return fmt.Errorf("fork %q: %w", m.Name, err)
	}
	if err := mg.planKept(ctx, p, t); err != nil {
		return err
	}
	p.mode, p.hibernated = forkHibernated, m
	return nil
}

// planChildren validates the count, names, TTL and identity options of
// plan p's request and gives each child its name and hostname.
func (mg *Manager) planChildren(p *forkPlan, parent string) error {
	req := p.req
	names, err := mg.childNames(req)
	if err != nil {
		return fmt.Errorf("fork %q: %w", req.Source, err)
	}
	if err := req.Identity.ValidateFor(len(names)); err != nil {
		return fmt.Errorf("fork %q: %w", req.Source, err)
	}
	pattern := req.Identity.Spec.Hostname
	if pattern == "" {
		pattern = customize.DefaultHostname
	}
	for i, n := range names {
		c := PlannedChild{Name: n, Index: i + 1}
		if !slices.Contains(req.Identity.Spec.Skip, customize.StepHostname) {
			h, err := customize.ExpandHostname(pattern, customize.Child{Name: n, Parent: parent, Index: i + 1})
			if err != nil {
				return fmt.Errorf("fork %q: %w", req.Source, asInvalid(err))
			}
			c.Hostname = h
		}
		p.children = append(p.children, c)
	}
	return nil
}

// PlanFork checks a fork as Fork does and says what it would do.
func (mg *Manager) PlanFork(ctx context.Context, req ForkRequest) (*Plan, error) {
	return dryRun(mg.planFork(ctx, req, noLocks()))
}

// render says what applying p does.
func (p *forkPlan) render() *Plan {
	out := &Plan{Command: "fork", Changed: true, Source: p.req.Source, Children: p.children}
	n := len(p.children)
	switch p.mode {
	case forkHibernated:
		out.add("start %d children from hibernated machine %q's instant (template %s), its RAM brought back to the mem dir first; it stays hibernated", n, p.hibernated.Name, p.tpl.ID)
	case forkKept:
		out.Template = p.tpl.Name
		if p.tpl.HasMemory {
			out.add("start %d children from kept template %q (%s); its source is not touched", n, p.tpl.Name, p.tpl.ID)
		} else {
			out.add("boot %d children fresh from kept template %q's disk (%s); its source is not touched", n, p.tpl.Name, p.tpl.ID)
		}
	case forkLive:
		out.SourcePauses = true
		p.renderAdopt(out)
		out.add("pause running machine %q for a fraction of a second and freeze it into a new template; it carries on", p.source.Name)
		out.add("start %d children from that instant", n)
	case forkDiskOnly:
		p.renderAdopt(out)
		if p.req.CrashConsistent {
			out.add("disk-only, crash-consistent: no pause and no filesystem freeze; running machine %q's disks switch to new overlays in one transaction, as if its power went at that instant; it carries on", p.source.Name)
		} else {
			out.add("disk-only: no pause, filesystems frozen for the switch, children boot: running machine %q's guest agent freezes its filesystems (at most %v), its disks switch to new overlays in one transaction, and they are thawed; its vCPUs never stop", p.source.Name, FSFreezeTimeout)
		}
		out.add("boot %d children fresh from that view of its disks", n)
	case forkStopped:
		p.renderAdopt(out)
		out.add("freeze stopped machine %q's disk into a new template; its %d children boot fresh from it", p.source.Name, n)
	}
	p.renderDisks(out)
	if p.req.TTL > 0 {
		out.add("give every child a TTL of %v: the reaper removes it then", p.req.TTL)
	}
	if p.contract.Enforced() || p.req.Contract != nil {
		out.add("%s", describeContract(p.contract))
	}
	out.Contract = p.contract
	if p.admission != nil {
		out.add("%s", p.admission.describe())
		out.Admission = p.admission
	}
	for _, c := range p.children {
		out.add("start child %q (identity %s, hostname %q); its network link goes up once its identity is set", c.Name, p.req.Identity.Spec.Mode(), c.Hostname)
	}
	return out
}

func (p *forkPlan) renderAdopt(out *Plan) {
	if p.adopt {
		out.add("adopt %s machine %q (not made by vmfork; it stays its owner's)", p.source.Driver, p.source.Name)
	}
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
	// childIncoming: a new QEMU gets the state and RAM by postcopy
	// migration from another host (fork-serve --incoming, forkto_live.go).
	childIncoming
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
	// incoming: childIncoming's socket and control lines.
	incoming *incomingHooks
}

// live reports whether the child continues from the template's state.
func (cs childStart) live() bool { return cs.mode != childBoot }
