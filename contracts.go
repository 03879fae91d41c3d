package vmfork

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/vmfork/vmfork/contract"
)

// The fork contract (DESIGN, "The fork contract"; the contract package has
// the spec): a machine's record holds its contract, a template's the one
// its children get, and a child inherits its parent's (its template's)
// unless its fork names another. The driver enforces the host's part
// (Enforcer): egress rules go with the machine's process and network, and
// are removed with it. The identity chain applies the guest's part (the
// inherited connections reset, the secret files wiped and rotated, the
// secrets' placeholders) before a child's NIC comes up. A contract the driver cannot enforce for a machine's
// network is refused by the plan, before anything is paused; it is never
// ignored.

// Enforcer is the optional driver capability to enforce fork contracts.
// A driver without it refuses every contract that asks for something.
type Enforcer interface {
	// CheckContract returns nil when the driver can enforce c for a
	// machine like m (its network as m.Spec has it), and otherwise an
	// error wrapping ErrUnsupported that names what cannot be enforced. It
	// changes nothing: plans call it.
	CheckContract(ctx context.Context, m *Machine, c *contract.Contract) error
	// ApplyContract replaces the host-side rules of running machine m by
	// c's (m.Contract is still the old one). Idempotent. On error the old
	// rules MUST still be in force.
	ApplyContract(ctx context.Context, m *Machine, c *contract.Contract) error
	// DescribeContract lists the host-side rules in force for m, one line
	// each, as vmfork contract NAME shows them; none for a machine without
	// a contract or a stopped one.
	DescribeContract(ctx context.Context, m *Machine) ([]string, error)
}

// checkContract refuses, for a plan, a contract c that the driver cannot
// enforce on a machine like m. verb and name start the error. A refusal is
// bad input (ErrInvalid: exit 2) as well as what it says: the request asks
// for what this host cannot give, and is never run without it.
func (mg *Manager) checkContract(ctx context.Context, verb, name string, m *Machine, c *contract.Contract) error {
	if !c.Enforced() {
		return nil
	}
	refuse := func(err error) error {
		return fmt.Errorf("%s %q: contract: %w", verb, name, refusal{err})
	}
	e, ok := mg.Driver.(Enforcer)
	if !ok {
		return refuse(fmt.Errorf("driver %q cannot enforce a contract: %w", mg.Driver.Name(), ErrUnsupported))
	}
	if err := e.CheckContract(ctx, m, c); err != nil {
		return refuse(err)
	}
	if err := mg.checkSecrets(m, c); err != nil {
		return refuse(err)
	}
	if err := checkSecretFiles(c); err != nil {
		return refuse(err)
	}
	return nil
}

// refusal is a contract the host cannot enforce: it is what its error
// says (often ErrUnsupported), and bad input too (ErrInvalid, exit 2),
// without saying so twice.
type refusal struct{ err error }

func (r refusal) Error() string        { return r.err.Error() }
func (r refusal) Unwrap() error        { return r.err }
func (r refusal) Is(target error) bool { return target == ErrInvalid }

// describeContract is the plan's line for contract c.
func describeContract(c *contract.Contract) string {
	if !c.Enforced() {
		return "no contract: the children reach what their parent reaches and keep its connections"
	}
	var parts []string
	if c.Network != nil {
		n := c.Network
		egress := string(n.Egress.Mode)
		if n.Egress.Mode == contract.EgressAllow {
			var dests []string
			for _, d := range n.Egress.Allow {
				dests = append(dests, d.String())
			}
			egress = "only to " + strings.Join(dests, ", ")
		}
		parts = append(parts, "egress "+egress, "DNS "+string(n.DNS), "inherited TCP connections "+string(n.Connections))
	}
	for _, name := range c.SecretNames() {
		parts = append(parts, fmt.Sprintf("secret %s for %s", name, strings.Join(c.Secrets[name].Hosts, ", ")))
	}
	if f := describeSecretFiles(c.SecretFiles); f != "" {
		parts = append(parts, f)
	}
	return "enforce the contract: " + strings.Join(parts, "; ")
}

// ContractStatus is a machine's contract as vmfork contract NAME shows it.
// Its JSON form is a contract with scripts: change it only by adding.
type ContractStatus struct {
	Name     string             `json:"name"`
	State    State              `json:"state"`
	Contract *contract.Contract `json:"contract,omitempty"`
	// Rules are the host-side rules in force, one line each.
	Rules []string `json:"rules"`
}

// Contract returns machine name's contract and the host rules enforcing it.
func (mg *Manager) Contract(ctx context.Context, name string) (*ContractStatus, error) {
	m, err := mg.Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("contract: %w", err)
	}
	st := &ContractStatus{Name: m.Name, State: m.State, Contract: m.Contract, Rules: []string{}}
	if e, ok := mg.Driver.(Enforcer); ok && m.State == StateRunning && m.Driver == mg.Driver.Name() {
		rules, err := e.DescribeContract(ctx, m)
		if err != nil {
			return nil, fmt.Errorf("contract %q: %w", name, err)
		}
		st.Rules = append(st.Rules, rules...)
	}
	return st, nil
}

// contractPlan is a change of a running machine's contract, checked once.
type contractPlan struct {
	m        *Machine
	c        *contract.Contract
	enforcer Enforcer
}

// planSetContract checks a change of running machine name's contract to
// c: only its network part may change in place (its secrets' placeholders
// are in the guest already).
func (mg *Manager) planSetContract(ctx context.Context, name string, c *contract.Contract, l *lockSet) (*contractPlan, error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("contract: %w", err)
	}
	if err := l.take(ctx, name); err != nil {
		return nil, fmt.Errorf("contract %q: %w", name, err)
	}
	m, err := mg.Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("contract: %w", err)
	}
	if m.Driver != mg.Driver.Name() {
		return nil, fmt.Errorf("contract %q: machine belongs to driver %q: %w", name, m.Driver, ErrInvalid)
	}
	if m.State != StateRunning {
		return nil, fmt.Errorf("contract %q: machine is %s; a contract changes in place only while it runs (a fork names another one): %w", name, m.State, ErrNotRunning)
	}
	if !reflect.DeepEqual(secretsOf(m.Contract), secretsOf(c)) {
		return nil, fmt.Errorf("contract %q: secrets: only the network part changes in place; the guest holds its secrets' placeholders already (fork it with the new contract instead): %w", name, ErrInvalid)
	}
	e, ok := mg.Driver.(Enforcer)
	if !ok {
		return nil, fmt.Errorf("contract %q: driver %q cannot enforce a contract: %w", name, mg.Driver.Name(), ErrUnsupported)
	}
	if err := e.CheckContract(ctx, m, c); err != nil {
		return nil, fmt.Errorf("contract %q: %w", name, err)
	}
	return &contractPlan{m: m, c: c, enforcer: e}, nil
}

func secretsOf(c *contract.Contract) map[string]contract.Secret {
	if c == nil || len(c.Secrets) == 0 {
		return nil
	}
	return c.Secrets
}

// SetContract changes running machine name's contract to c in place: its
// host rules are replaced (the old ones stay on error), then its record.
func (mg *Manager) SetContract(ctx context.Context, name string, c *contract.Contract) (*ContractStatus, error) {
	l := mg.locks()
	defer l.release()
	p, err := mg.planSetContract(ctx, name, c, l)
	if err != nil {
		return nil, err
	}
	if err := p.enforcer.ApplyContract(ctx, p.m, c); err != nil {
		return nil, fmt.Errorf("contract %q: %w (the old rules stay in force)", name, err)
	}
	p.m.Contract = c.Clone()
	if err := mg.Store.SaveMachine(p.m); err != nil {
		return nil, fmt.Errorf("contract %q: %w", name, err)
	}
	mg.Log.WithField("machine", name).Info("contract changed")
	l.release()
	return mg.Contract(ctx, name)
}

// PlanSetContract checks a contract change as SetContract does and says
// what it would do.
func (mg *Manager) PlanSetContract(ctx context.Context, name string, c *contract.Contract) (*Plan, error) {
	return dryRun(mg.planSetContract(ctx, name, c, noLocks()))
}

func (p *contractPlan) render() *Plan {
	out := &Plan{Command: "contract", Changed: !reflect.DeepEqual(p.m.Contract, p.c), Machines: []string{p.m.Name}, Contract: p.c}
	if !out.Changed {
		return out
	}
	line := describeContract(p.c)
	if !p.c.Enforced() {
		line = "lift every rule: the machine reaches what its network reaches"
	}
	out.add("replace running machine %q's host rules: %s", p.m.Name, strings.TrimPrefix(line, "enforce the contract: "))
	return out
}

// inheritedContract is the contract a child gets: req's, else its
// parent's or template's (from).
func inheritedContract(req *contract.Contract, from *contract.Contract) *contract.Contract {
	if req != nil {
		return req.Clone()
	}
	return from.Clone()
}

// hostsOf lists the hosts c's secrets are bound to, sorted, once each.
func hostsOf(c *contract.Contract) []string {
	var hosts []string
	for _, s := range c.Secrets {
		hosts = append(hosts, s.Hosts...)
	}
	slices.Sort(hosts)
	return slices.Compact(hosts)
}
