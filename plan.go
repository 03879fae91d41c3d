package vmfork

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/vmfork/vmfork/customize"
)

// A plan is what a command would do, computed with the same checks as the
// real run and without changing anything: no record, lock file, journal
// entry, process or adoption is made, and nothing is paused. The CLI's
// --dry-run prints it; the Ansible modules use it for check mode.

// Plan is what one command would do. Its JSON form is a contract with the
// Ansible modules: change it only by adding.
type Plan struct {
	DryRun  bool   `json:"dry_run"` // always true: nothing was changed
	Command string `json:"command"` // boot, fork, template save, template rm, rm
	// Changed says whether the real run would change anything.
	Changed bool `json:"changed"`
	// Actions says what would happen, in order, one sentence each.
	Actions []string `json:"actions"`
	// Source is the machine or kept template a fork or save would start from.
	Source string `json:"source,omitempty"`
	// Template is the kept template's name a fork would use or a save
	// would create.
	Template string `json:"template,omitempty"`
	// SourcePauses says whether the source would pause (a fork of a running
	// machine, or a save).
	SourcePauses bool `json:"source_pauses"`
	// Children are the machines a fork would make, in order.
	Children []PlannedChild `json:"children,omitempty"`
	// Machines are the machines boot would create or rm remove.
	Machines []string `json:"machines,omitempty"`
}

// PlannedChild is one child a fork would make.
type PlannedChild struct {
	Name     string `json:"name"`
	Index    int    `json:"index"`
	Hostname string `json:"hostname,omitempty"`
}

// PlanBoot checks a boot as Boot does and says what it would do.
func (mg *Manager) PlanBoot(name string, spec Spec) (*Plan, error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	// Boot finds a taken name when it creates the record.
	if _, err := mg.Store.LoadMachine(name); err == nil {
		return nil, fmt.Errorf("boot: machine %q: %w", name, ErrExists)
	}
	p := &Plan{Command: "boot", Changed: true, Machines: []string{name}}
	p.add("create machine %q (%d MiB, %d CPUs) with driver %q and start it", name, spec.MemoryMiB, spec.CPUs, mg.Driver.Name())
	return p.done(), nil
}

// PlanFork checks a fork as Fork does and says what it would do.
func (mg *Manager) PlanFork(ctx context.Context, req ForkRequest) (*Plan, error) {
	if _, ok := mg.Driver.(Forker); !ok {
		return nil, fmt.Errorf("fork %q: driver %q: %w", req.Source, mg.Driver.Name(), ErrUnsupported)
	}
	if err := ValidateName(req.Source); err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	p := &Plan{Command: "fork", Changed: true, Source: req.Source}
	var names []string
	var parent string
	if m, err := mg.Store.LoadMachine(req.Source); err == nil && m.State == StateHibernated {
		if names, err = mg.childNames(req); err != nil {
			return nil, fmt.Errorf("fork %q: %w", req.Source, err)
		}
		if err := req.Identity.ValidateFor(len(names)); err != nil {
			return nil, fmt.Errorf("fork %q: %w", req.Source, err)
		}
		p.add("start %d children from hibernated machine %q's instant (template %s); it stays hibernated", len(names), m.Name, m.Hibernated)
		return mg.planChildren(p, names, m.Name, req)
	}
	if _, err := mg.Store.LoadMachine(req.Source); errors.Is(err, ErrNotFound) {
		if t, err := mg.Store.FindKept(req.Source); err == nil {
			if !t.HasMemory {
				return nil, fmt.Errorf("fork %q: template %s holds no memory: %w", req.Source, t.ID, ErrInvalid)
			}
			if names, err = mg.childNames(req); err != nil {
				return nil, fmt.Errorf("fork %q: %w", req.Source, err)
			}
			if err := req.Identity.ValidateFor(len(names)); err != nil {
				return nil, fmt.Errorf("fork %q: %w", req.Source, err)
			}
			p.Template, parent = t.Name, t.Source
			p.add("start %d children from kept template %q (%s); its source is not touched", len(names), t.Name, t.ID)
			return mg.planChildren(p, names, parent, req)
		}
	}
	src, err := mg.Get(ctx, req.Source)
	if errors.Is(err, ErrNotFound) {
		if a, ok := mg.Driver.(Adopter); ok {
			// Adopt only inspects; the real run records the adoption.
			if src, err = a.Adopt(ctx, req.Source, mg.Store.MachinePaths(req.Source)); err == nil {
				p.add("adopt %s machine %q (not made by vmfork; it stays its owner's)", mg.Driver.Name(), req.Source)
			} else {
				err = fmt.Errorf("machine %q: %w", req.Source, err)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	if src.Driver != mg.Driver.Name() {
		return nil, fmt.Errorf("fork %q: machine belongs to driver %q: %w", src.Name, src.Driver, ErrInvalid)
	}
	if src.Adopted != nil && src.State != StateRunning {
		return nil, fmt.Errorf("fork %q: an adopted machine is forked only while it runs, and it is %s: %w", src.Name, src.State, ErrInvalid)
	}
	if src.State != StateRunning && src.State != StateStopped {
		return nil, fmt.Errorf("fork %q: machine is %s: %w", src.Name, src.State, ErrInvalid)
	}
	if names, err = mg.childNames(req); err != nil {
		return nil, fmt.Errorf("fork %q: %w", req.Source, err)
	}
	if err := req.Identity.ValidateFor(len(names)); err != nil {
		return nil, fmt.Errorf("fork %q: %w", req.Source, err)
	}
	if src.State == StateRunning {
		p.SourcePauses = true
		p.add("pause running machine %q for a fraction of a second and freeze it into a new template; it carries on", src.Name)
		p.add("start %d children from that instant", len(names))
	} else {
		p.add("freeze stopped machine %q's disk into a new template; its %d children boot fresh from it", src.Name, len(names))
	}
	return mg.planChildren(p, names, src.Name, req)
}

// planChildren adds the children and their hostnames to p.
func (mg *Manager) planChildren(p *Plan, names []string, parent string, req ForkRequest) (*Plan, error) {
	pattern := req.Identity.Spec.Hostname
	if pattern == "" {
		pattern = customize.DefaultHostname
	}
	for i, n := range names {
		c := PlannedChild{Name: n, Index: i + 1}
		if !slices.Contains(req.Identity.Spec.Skip, customize.StepHostname) {
			h, err := customize.ExpandHostname(pattern, customize.Child{Name: n, Parent: parent, Index: i + 1})
			if err != nil {
				return nil, fmt.Errorf("fork %q: %w", req.Source, asInvalid(err))
			}
			c.Hostname = h
		}
		p.Children = append(p.Children, c)
		p.add("start child %q (identity %s, hostname %q); its network link goes up once its identity is set", n, req.Identity.Spec.Mode(), c.Hostname)
	}
	return p.done(), nil
}

// PlanKeep checks a template save as Keep does and says what it would do.
func (mg *Manager) PlanKeep(ctx context.Context, req KeepRequest) (*Plan, error) {
	if _, ok := mg.Driver.(Forker); !ok {
		return nil, fmt.Errorf("keep %q: driver %q: %w", req.Source, mg.Driver.Name(), ErrUnsupported)
	}
	if err := mg.checkKeepRequest(req); err != nil {
		return nil, err
	}
	if _, err := mg.Store.LoadMachine(req.Name); err == nil {
		return nil, fmt.Errorf("keep %q as %q: a machine has that name: %w", req.Source, req.Name, ErrExists)
	}
	if k, err := mg.Store.FindKept(req.Name); err == nil {
		return nil, fmt.Errorf("keep %q as %q: template %s is kept under that name: %w", req.Source, req.Name, k.ID, ErrExists)
	}
	src, err := mg.Get(ctx, req.Source)
	if err != nil {
		return nil, fmt.Errorf("keep: %w", err)
	}
	if src.Driver != mg.Driver.Name() {
		return nil, fmt.Errorf("keep %q: machine belongs to driver %q: %w", src.Name, src.Driver, ErrInvalid)
	}
	live, err := checkKeepSource(src, req.Pool)
	if err != nil {
		return nil, err
	}
	p := &Plan{Command: "template save", Changed: true, Source: src.Name, Template: req.Name, SourcePauses: live}
	if live {
		p.add("pause running machine %q for a fraction of a second and keep that instant as template %q; it carries on", src.Name, req.Name)
	} else {
		p.add("keep stopped machine %q's disk as template %q (children boot fresh from it); the machine gets an overlay on it", src.Name, req.Name)
	}
	if req.Pool > 0 {
		p.add("start %d warm-pool processes of template %q", req.Pool, req.Name)
	}
	return p.done(), nil
}

// PlanUnkeep checks a template rm as Unkeep does and says what it would do.
func (mg *Manager) PlanUnkeep(ctx context.Context, name string) (*Plan, error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	t, err := mg.Store.FindKept(name)
	if err != nil {
		return nil, err
	}
	st := mg.templateStatus(ctx, t, nil)
	p := &Plan{Command: "template rm", Changed: true, Template: name}
	if st.Pooled > 0 {
		p.add("stop the %d warm-pool processes of template %q", st.Pooled, name)
	}
	if st.Children > 0 {
		p.add("give up the name %q; template %s stays until its %d children are gone", name, t.ID, st.Children)
	} else {
		p.add("remove template %q (%s) with its RAM, device state and frozen disk unless a disk builds on it", name, t.ID)
	}
	return p.done(), nil
}

// PlanRemove checks an rm of names as Remove does and says what it would
// do. Like rm it checks every name: errs[i] is names[i]'s error, or nil.
func (mg *Manager) PlanRemove(ctx context.Context, names []string, force bool) (*Plan, []error) {
	p := &Plan{Command: "rm", Machines: []string{}}
	errs := make([]error, len(names))
	for i, name := range names {
		if err := ValidateName(name); err != nil {
			errs[i] = fmt.Errorf("rm: %w", err)
			continue
		}
		m, err := mg.Get(ctx, name)
		if err != nil {
			errs[i] = fmt.Errorf("rm: %w", err)
			continue
		}
		switch {
		case m.Adopted != nil:
			// Disown only inspects; it says what keeps the machine.
			a, ok := mg.Driver.(Adopter)
			if !ok || m.Driver != mg.Driver.Name() {
				errs[i] = fmt.Errorf("rm: forget %q: machine was adopted by driver %q, not %q: %w", name, m.Driver, mg.Driver.Name(), ErrInvalid)
				continue
			}
			if err := a.Disown(ctx, m); err != nil {
				errs[i] = fmt.Errorf("rm: forget %q: %w", name, err)
				continue
			}
			p.add("forget adopted machine %q; it runs on, as its owner's", name)
		case m.Driver != mg.Driver.Name() && !force:
			errs[i] = fmt.Errorf("rm: stop %q: machine belongs to driver %q, not %q: %w (use --force to remove it anyway)", name, m.Driver, mg.Driver.Name(), ErrInvalid)
			continue
		case m.State == StateStopped:
			p.add("delete stopped machine %q with its disk overlay, record and logs", name)
		case m.State == StateHibernated:
			p.add("delete hibernated machine %q with its disk overlay, record and logs; its RAM file on disk goes once no child of it maps it", name)
		default:
			p.add("kill machine %q (pid %d) and delete it with its disk overlay, record, sockets, logs and RAM file", name, m.PID)
		}
		p.Changed = true
		p.Machines = append(p.Machines, name)
	}
	return p.done(), errs
}

func (p *Plan) add(format string, args ...any) {
	p.Actions = append(p.Actions, fmt.Sprintf(format, args...))
}

func (p *Plan) done() *Plan {
	p.DryRun = true
	if p.Actions == nil {
		p.Actions = []string{}
	}
	return p
}
