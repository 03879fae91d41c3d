package vmfork

import (
	"context"
	"fmt"
	"github.com/vmfork/vmfork/contract"
)

// Every verb that changes something runs in two halves, plan and apply
// (Terraform's shape; kubectl's server-side dry run runs the real admission
// chain and skips only the write):
//
//   - planX(ctx, req, locks) resolves the request once and runs every check:
//     names, the source's record and state, the driver's capabilities, the
//     template's fit to this host, the network. It reads and changes
//     nothing: no record, journal entry, process or adoption is made, and
//     nothing is paused. It returns a plan holding what it resolved (the
//     loaded source, the template, the children's names and hostnames),
//     with the names it locked on the way.
//   - X(ctx, req) repairs what dead commands left (Recover), plans with the
//     store's locks, and applies that plan. The steps below the plan take
//     the plan and neither reload nor recheck what it holds.
//   - PlanX(ctx, req) plans with no locks and renders the plan (render):
//     --dry-run and the Ansible modules' check mode print it. Because it is
//     the same plan, it fails where the real run fails, with the same error
//     and exit code; a check written into an apply instead of its plan is
//     a bug that plan_parity_test.go catches.
//
// A verb's plan, apply, dry run and crash repair live together in the
// verb's own file (fork: forkplan.go and fork.go; hibernate: hibernate.go;
// docs/ARCHITECTURE.md has the list).

// Plan is what one command would do. Its JSON form is a contract with the
// Ansible modules: change it only by adding.
type Plan struct {
	DryRun  bool   `json:"dry_run"` // always true: nothing was changed
	Command string `json:"command"` // boot, fork, template save, template rm, rm, ...
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
	// Contract is the contract the machines made would have.
	Contract *contract.Contract `json:"contract,omitempty"`
	// Admission is what the new machines would take of the host, and what
	// it has (admission.go).
	Admission *Admission `json:"admission,omitempty"`
}

// PlannedChild is one child a fork would make.
type PlannedChild struct {
	Name     string `json:"name"`
	Index    int    `json:"index"`
	Hostname string `json:"hostname,omitempty"`
}

func (p *Plan) add(format string, args ...any) {
	p.Actions = append(p.Actions, fmt.Sprintf(format, args...))
}

// renderer is a verb's plan: render says what its apply would do.
type renderer interface {
	render() *Plan
}

// dryRun renders plan p, made with noLocks, for a PlanX method.
func dryRun[P renderer](p P, err error) (*Plan, error) {
	if err != nil {
		return nil, err
	}
	out := p.render()
	out.DryRun = true
	if out.Actions == nil {
		out.Actions = []string{}
	}
	return out, nil
}

// lockSet holds the name locks a plan took for its apply, in the order it
// took them. A dry run's set takes none: it reads what the real run would
// read, and a name a live command holds would only make it wait.
type lockSet struct {
	store  *Store // nil: a dry run's
	unlock []func()
}

// locks returns a lockSet that takes the store's locks.
func (mg *Manager) locks() *lockSet { return &lockSet{store: mg.Store} }

// noLocks is the dry run's lockSet.
func noLocks() *lockSet { return &lockSet{} }

// take locks name, waiting until ctx ends (Store.Lock).
func (l *lockSet) take(ctx context.Context, name string) error {
	if l.store == nil {
		return nil
	}
	unlock, err := l.store.Lock(ctx, name)
	if err != nil {
		return err
	}
	l.unlock = append(l.unlock, unlock)
	return nil
}

// release unlocks every name, the last taken first. Idempotent.
func (l *lockSet) release() {
	for i := len(l.unlock) - 1; i >= 0; i-- {
		l.unlock[i]()
	}
	l.unlock = nil
}
