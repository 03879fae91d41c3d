package vmfork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/customize"
	"github.com/vmfork/vmfork/overlay"
)

// Resume is a fork in place of a hibernated machine's template
// (hibernate.go has the model and its crash safety).

// ResumeRequest asks to resume hibernated machine Machine. Identity edits
// the resume's chain, which runs only the agent and clock steps.
type ResumeRequest struct {
	Machine  string
	Identity IdentityOptions
}

// resumePlan is a resume resolved and checked once.
type resumePlan struct {
	req     ResumeRequest
	starter InPlaceStarter
	m       *Machine
	t       *Template
}

// planResume checks a resume of hibernated machine req.Machine, taking its
// lock in l.
func (mg *Manager) planResume(ctx context.Context, req ResumeRequest, l *lockSet) (*resumePlan, error) {
	_, starter, err := mg.inPlacer("resume", req.Machine)
	if err != nil {
		return nil, err
	}
	if err := req.Identity.ValidateFor(1); err != nil {
		return nil, fmt.Errorf("resume %q: %w", req.Machine, err)
	}
	if err := l.take(ctx, req.Machine); err != nil {
		return nil, fmt.Errorf("resume %q: %w", req.Machine, err)
	}
	m, t, err := mg.hibernatedMachine(ctx, "resume", req.Machine)
	if err != nil {
		return nil, err
	}
	return &resumePlan{req: req, starter: starter, m: m, t: t}, nil
}

// Resume continues hibernated machine req.Machine from its template, in
// place. If the new process fails to come up the machine stays hibernated
// and the error says so.
func (mg *Manager) Resume(ctx context.Context, req ResumeRequest) (res *ChildResult, err error) {
	defer func() { err = mg.Store.explainFull(err, 0) }()
	mg.recoverFirst(ctx)
	l := mg.locks()
	defer l.release()
	p, err := mg.planResume(ctx, req, l)
	if err != nil {
		return nil, err
	}
	return mg.applyResume(ctx, p)
}

// PlanResume checks a resume as Resume does and says what it would do.
func (mg *Manager) PlanResume(ctx context.Context, req ResumeRequest) (*Plan, error) {
	return dryRun(mg.planResume(ctx, req, noLocks()))
}

func (p *resumePlan) render() *Plan {
	m, t := p.m, p.t
	out := &Plan{Command: "resume", Changed: true, Source: m.Name, Machines: []string{m.Name}}
	out.add("bring machine %q's RAM back from %s to the mem dir", m.Name, t.Hibernation)
	out.add("start machine %q from template %s where it stopped, with its name, MAC and ports; step its clock to the host's", m.Name, t.ID)
	return out
}

// applyResume carries out plan p; the caller holds its lock.
func (mg *Manager) applyResume(ctx context.Context, p *resumePlan) (*ChildResult, error) {
	start := time.Now()
	m, t := p.m, p.t
	done, err := mg.Store.journal(journalEntry{Op: opResume, Source: m.Name, Template: t.ID})
	if err != nil {
		return nil, fmt.Errorf("resume %q: %w", m.Name, err)
	}
	defer done()
	if err := mg.Store.thaw(ctx, t); err != nil {
		return nil, fmt.Errorf("resume %q: %w", m.Name, err)
	}
	old := *m
	c, err := mg.resumedMachine(ctx, m, t)
	fail := func(err error) (*ChildResult, error) {
		if c != nil && c.Paths.Disk != old.Paths.Disk {
			os.Remove(c.Paths.Disk)
		}
		if c != nil {
			dropNewDisks(c, &old)
		}
		old.Template = t.ID // as a crashed resume leaves it (journal.go)
		if serr := mg.Store.SaveMachine(&old); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, fmt.Errorf("resume %q: %w (the machine stays hibernated)", m.Name, err)
	}
	if err != nil {
		return fail(err)
	}
	if err := p.starter.StartInPlace(ctx, c, t); err != nil {
		return fail(err)
	}
	running := time.Since(start)
	mg.attachLedger(ctx, c)
	Fault(FaultResumeRunning, c.PID)
	opts := p.req.Identity
	opts.Edit = resumeChain(opts.Edit)
	id, err := mg.applyIdentity(ctx, c, t, 1, true, opts)
	if err != nil {
		mg.Driver.Stop(context.WithoutCancel(ctx), c, true)
		mg.detachLedger(ctx, c)
		return fail(fmt.Errorf("identity: %w", err))
	}
	c.State, c.Hibernated = StateRunning, ""
	// The chain ran only its agent and clock steps: the machine keeps the
	// identity it had (its hostname, addresses, machine-id), which ls shows.
	if old.Identity != nil {
		c.Identity = old.Identity
	}
	if err := mg.Store.SaveMachine(c); err != nil {
		return nil, err
	}
	if c.Paths.Disk != "" {
		overlay.RemoveOldTops(c.Paths.Dir, c.Paths.Disk)
	}
	RemoveOldDiskTops(c)
	// The machine maps the thawed RAM now; the copy on disk has served.
	if t.Hibernation != "" {
		os.Remove(t.Hibernation)
		t.Hibernation = ""
		if err := mg.Store.WriteTemplate(t); err != nil {
			mg.Log.WithError(err).Warn("could not record the resumed machine's template")
		}
	}
	mg.Log.WithFields(logrus.Fields{"machine": c.Name, "template": t.ID}).Info("machine resumed")
	return &ChildResult{
		Name: c.Name, PID: c.PID, State: StateRunning, Ports: c.Spec.Ports, Identity: id,
		RunningMS: ms(running), ReadyMS: ms(time.Since(start)),
	}, nil
}

// hibernatedMachine loads hibernated machine name and its template and
// checks that the template fits this host. The caller holds name's lock.
func (mg *Manager) hibernatedMachine(ctx context.Context, verb, name string) (*Machine, *Template, error) {
	m, err := mg.Store.LoadMachine(name)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", verb, err)
	}
	if m.State != StateHibernated {
		return nil, nil, fmt.Errorf("%s %q: machine is %s, not hibernated: %w", verb, name, m.State, ErrInvalid)
	}
	if m.Driver != mg.Driver.Name() {
		// Both drivers hibernate: a machine comes back on its own.
		return nil, nil, fmt.Errorf("%s %q: machine belongs to driver %q: %w", verb, name, m.Driver, ErrInvalid)
	}
	t, err := mg.Store.LoadTemplate(m.Hibernated)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %q: %w", verb, name, err)
	}
	if err := mg.CheckTemplate(ctx, t); err != nil {
		return nil, nil, fmt.Errorf("%s %q: %w", verb, name, err)
	}
	return m, t, nil
}

// resumedMachine is machine m's record as a child of its hibernation
// template t (inPlaceChild): the same machine going on, so its vmgenid
// stays (no RNG reseed is due) and its NIC keeps the MAC its guest has.
func (mg *Manager) resumedMachine(ctx context.Context, m *Machine, t *Template) (*Machine, error) {
	return mg.inPlaceChild(ctx, m, t, func(c *Machine) error {
		c.VMGenID = t.VMGenID
		return nil
	})
}

// resumeChain runs only the agent and clock steps of a resumed machine's
// chain, then edit: it keeps the identity it had, and its clock is behind
// by the time it slept.
func resumeChain(edit func(customize.Chain) customize.Chain) func(customize.Chain) customize.Chain {
	return func(c customize.Chain) customize.Chain {
		var skip []string
		for _, n := range c.Names() {
			if n != customize.StepAgent && n != customize.StepClock {
				skip = append(skip, n)
			}
		}
		c = c.Skip("resume: the machine keeps its identity", skip...)
		if edit != nil {
			c = edit(c)
		}
		return c
	}
}

// forkHibernated makes the children of plan p, of a hibernated machine's
// template (planHibernatedFork); the machine stays hibernated. The caller
// holds the plan's locks.
func (mg *Manager) forkHibernated(ctx context.Context, p *forkPlan) (*ForkResult, error) {
	req, t := p.req, p.tpl
	// Journaled, so that a kill in the middle of the copy leaves no
	// temporary file (a fork entry with only a template: journal.go).
	done, err := mg.Store.journal(journalEntry{Op: opFork, Template: t.ID})
	if err != nil {
		return nil, fmt.Errorf("fork %q: %w", req.Source, err)
	}
	err = mg.Store.thaw(ctx, t)
	done()
	if err != nil {
		return nil, fmt.Errorf("fork %q: %w", req.Source, err)
	}
	return mg.forkPlanned(ctx, p)
}

// repairResume undoes a resume whose vmfork process died before it
// finished (journal.go): the machine stays hibernated. One that had
// finished has its RAM file on disk removed.
func (mg *Manager) repairResume(ctx context.Context, e journalEntry) (done bool, err error) {
	m, t, terr, unlock, ok := mg.hibernationEntry(ctx, e)
	if !ok {
		return false, nil
	}
	defer unlock()
	if m == nil {
		return true, nil
	}
	if m.Hibernated != e.Template {
		if terr == nil && m.Template == t.ID && t.Hibernation != "" {
			// Resumed, and killed before the copy on disk was removed.
			os.Remove(t.Hibernation)
			t.Hibernation = ""
			return true, mg.Store.WriteTemplate(t)
		}
		return true, nil
	}
	if err := mg.stopAll(ctx, m); err != nil {
		return false, fmt.Errorf("repair %q after an interrupted %s: %w", m.Name, e.Op, err)
	}
	m.State, m.PID = StateHibernated, 0
	if err := mg.Store.SaveMachine(m); err != nil {
		return false, fmt.Errorf("repair %q after an interrupted %s: %w", m.Name, e.Op, err)
	}
	mg.Log.WithFields(logrus.Fields{"machine": m.Name, "template": e.Template}).Warn("a machine whose resume was interrupted stays hibernated")
	return true, nil
}
