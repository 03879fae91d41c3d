package vmfork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vmfork/vmfork/broker"

	"github.com/vmfork/vmfork/contract"
)

// Enforcer on the hibernating fake driver: it enforces every contract but
// one with DNS none (so that a refusal has a row), and records what it
// applied per machine.
func (d *hibDriver) CheckContract(ctx context.Context, m *Machine, c *contract.Contract) error {
	if c.NetworkOf().DNS == contract.DNSNone {
		return fmt.Errorf("the fake driver cannot enforce dns none: %w", ErrUnsupported)
	}
	return nil
}

func (d *hibDriver) ApplyContract(ctx context.Context, m *Machine, c *contract.Contract) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.applied == nil {
		d.applied = map[string]*contract.Contract{}
	}
	d.applied[m.Name] = c
	return nil
}

func (d *hibDriver) DescribeContract(ctx context.Context, m *Machine) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.applied[m.Name]; c != nil {
		return []string{"egress " + string(c.NetworkOf().Egress.Mode)}, nil
	}
	return nil, nil
}

func mustContract(t *testing.T, y string) *contract.Contract {
	t.Helper()
	c, err := contract.ParseYAML([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestContractInheritedAndReplaced(t *testing.T) {
	mg, _ := newHibManager(t)
	ctx := t.Context()
	none := mustContract(t, "network: {egress: none}")
	allow := mustContract(t, "network: {egress: {allow: [10.0.0.0/8:443]}}")
	kernel := kernelSpec(t)
	if _, err := mg.Boot(ctx, BootRequest{Name: "web", Spec: kernel, Contract: none}); err != nil {
		t.Fatal(err)
	}
	res, err := mg.Fork(ctx, ForkRequest{Source: "web", Count: 1, Identity: quietChain})
	if err != nil {
		t.Fatal(err)
	}
	child, _ := mg.Store.LoadMachine(res.Children[0].Name)
	if child.Contract.NetworkOf().Egress.Mode != contract.EgressNone {
		t.Errorf("child contract %+v, want its parent's (egress none)", child.Contract)
	}
	// A fork of the child with another contract: its children get that one.
	res, err = mg.Fork(ctx, ForkRequest{Source: child.Name, Count: 1, Identity: quietChain, Contract: allow})
	if err != nil {
		t.Fatal(err)
	}
	grand, _ := mg.Store.LoadMachine(res.Children[0].Name)
	if grand.Contract.NetworkOf().Egress.Mode != contract.EgressAllow {
		t.Errorf("grandchild contract %+v, want the fork's (allow)", grand.Contract)
	}
	if c, _ := mg.Store.LoadMachine(child.Name); c.Contract.NetworkOf().Egress.Mode != contract.EgressNone {
		t.Errorf("the fork changed its source's contract to %+v", c.Contract)
	}
	// A kept template with a contract of its own gives it to its children.
	if _, err := mg.Keep(ctx, KeepRequest{Source: "web", Name: "golden", Contract: allow}); err != nil {
		t.Fatal(err)
	}
	res, err = mg.Fork(ctx, ForkRequest{Source: "golden", Count: 1, Identity: quietChain})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := mg.Store.LoadMachine(res.Children[0].Name)
	if k.Contract.NetworkOf().Egress.Mode != contract.EgressAllow {
		t.Errorf("child of golden: contract %+v, want golden's", k.Contract)
	}
	// A rewind keeps the machine's own contract.
	if _, err := mg.Checkpoint(ctx, CheckpointRequest{Machine: "web", Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Rewind(ctx, RewindRequest{Machine: "web", To: "web-cp1", Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	if w, _ := mg.Store.LoadMachine("web"); w.Contract.NetworkOf().Egress.Mode != contract.EgressNone {
		t.Errorf("after a rewind web's contract is %+v, want its own", w.Contract)
	}
	// The dry run shows the children's contract.
	p, err := mg.PlanFork(ctx, ForkRequest{Source: "web", Count: 1})
	if err != nil || p.Contract.NetworkOf().Egress.Mode != contract.EgressNone || !strings.Contains(strings.Join(p.Actions, "\n"), "egress none") {
		t.Errorf("plan %+v, %v: want the inherited contract shown", p, err)
	}
}

func TestContractRefusedBeforeAnythingChanges(t *testing.T) {
	// A driver that enforces nothing refuses every contract.
	mg, d := newTestManager(t)
	bootFake(t, mg, "web")
	c := mustContract(t, "network: {egress: none}")
	before := stateTree(t, mg.Store)
	_, err := mg.Fork(t.Context(), ForkRequest{Source: "web", Count: 1, Contract: c})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "contract") || d.freezeSeen != 0 {
		t.Errorf("fork with a contract on a driver without Enforcer: %v (%d freezes), want ErrUnsupported before any pause", err, d.freezeSeen)
	}
	if got := withoutLocks(stateTree(t, mg.Store)); got != withoutLocks(before) {
		t.Errorf("the refused fork changed the state dir")
	}
	// A contract that asks for nothing is no contract.
	if _, err := mg.PlanFork(t.Context(), ForkRequest{Source: "web", Count: 1, Contract: &contract.Contract{}}); err != nil {
		t.Errorf("an empty contract: %v", err)
	}
}

func TestSetContract(t *testing.T) {
	mg, d := newHibManager(t)
	mg.Broker = &fakeBroker{}
	t.Setenv("T", "the-value")
	ctx := t.Context()
	secret := mustContract(t, "network: {egress: none}\nsecrets: {TOKEN: {hosts: [api.example.com], value_from: {env: T}}}")
	if _, err := mg.Boot(ctx, BootRequest{Name: "web", Spec: kernelSpec(t), Contract: secret}); err != nil {
		t.Fatal(err)
	}
	// The network part changes in place.
	wider := mustContract(t, "network: {egress: all}\nsecrets: {TOKEN: {hosts: [api.example.com], value_from: {env: T}}}")
	st, err := mg.SetContract(ctx, "web", wider)
	if err != nil {
		t.Fatal(err)
	}
	if st.Contract.NetworkOf().Egress.Mode != contract.EgressAll || d.applied["web"] != wider || len(st.Rules) != 1 {
		t.Errorf("after --set: %+v (applied %+v)", st, d.applied["web"])
	}
	// The secrets do not.
	if _, err := mg.SetContract(ctx, "web", mustContract(t, "network: {egress: all}")); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "secrets") {
		t.Errorf("--set without the secrets: %v, want ErrInvalid naming secrets", err)
	}
	// Only a running machine's.
	if _, err := mg.Stop(ctx, "web", true); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.SetContract(ctx, "web", wider); !errors.Is(err, ErrNotRunning) {
		t.Errorf("--set on a stopped machine: %v, want ErrNotRunning", err)
	}
}

// fakeBroker records registrations.
type fakeBroker struct {
	mu   sync.Mutex
	regs map[string]broker.Child
}

func (b *fakeBroker) Register(ctx context.Context, c broker.Child) (broker.Addr, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.regs == nil {
		b.regs = map[string]broker.Child{}
	}
	b.regs[c.Name] = c
	return broker.Addr{Network: "tcp", Address: "10.9.0.1:4000"}, nil
}

func (b *fakeBroker) Unregister(ctx context.Context, name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.regs, name)
	return nil
}

// BrokerEndpoint on the hibernating fake driver.
func (d *hibDriver) BrokerListen(m *Machine) (broker.Addr, bool, error) {
	return broker.Addr{Network: "tcp", Address: "10.9.0.1:0"}, false, nil
}

func (d *hibDriver) ProxyURL(m *Machine, a broker.Addr) (string, error) {
	return "http://" + a.Address, nil
}

// Each child of a fork gets its own value from the exec hook, its own
// placeholders, and goes from the broker with the child.
func TestBrokeredSecrets(t *testing.T) {
	mg, _ := newHibManager(t)
	b := &fakeBroker{}
	mg.Broker = b
	ctx := t.Context()
	c := mustContract(t, `secrets: {TOKEN: {hosts: [api.example.com], format: "Bearer {value}", value_from: {exec: 'echo "tok-$VMFORK_NAME-$VMFORK_INDEX"'}}}`)
	if _, err := mg.Boot(ctx, BootRequest{Name: "web", Spec: kernelSpec(t)}); err != nil {
		t.Fatal(err)
	}
	res, err := mg.Fork(ctx, ForkRequest{Source: "web", Count: 2, Identity: quietChain, Contract: c})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, ch := range res.Children {
		reg, ok := b.regs[ch.Name]
		if !ok || len(reg.Secrets) != 1 {
			t.Fatalf("%s: registration %+v", ch.Name, reg)
		}
		want := fmt.Sprintf("tok-%s-%d", ch.Name, i+1)
		m, _ := mg.Store.LoadMachine(ch.Name)
		if string(reg.Secrets[0].Value) != want || reg.PID != m.PID {
			t.Errorf("%s: value %q (pid %d), want %q and its QEMU's pid %d", ch.Name, reg.Secrets[0].Value, reg.PID, want, m.PID)
		}
		p := m.Broker.Placeholders["TOKEN"]
		if p == "" || seen[p] || m.Broker.ProxyURL != "http://10.9.0.1:4000" {
			t.Errorf("%s: broker state %+v, want a placeholder of its own and the proxy's URL", ch.Name, m.Broker)
		}
		seen[p] = true
		raw, _ := os.ReadFile(filepath.Join(m.Paths.Dir, "machine.json"))
		if strings.Contains(string(raw), want) {
			t.Errorf("%s: the record holds the value: %s", ch.Name, raw)
		}
	}
	if err := mg.Remove(ctx, res.Children[0].Name, false); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.regs[res.Children[0].Name]; ok || len(b.regs) != 1 {
		t.Errorf("after rm: registrations %v, want only the other child", b.regs)
	}
	// An env value that is not set is bad input, found before anything.
	env := mustContract(t, `secrets: {TOKEN: {hosts: [api.example.com], value_from: {env: VMFORK_TEST_UNSET_VAR}}}`)
	if _, err := mg.PlanFork(ctx, ForkRequest{Source: "web", Count: 1, Contract: env}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "VMFORK_TEST_UNSET_VAR") {
		t.Errorf("an unset env value: %v, want ErrInvalid naming it", err)
	}
	mg.Broker = nil
	if _, err := mg.PlanFork(ctx, ForkRequest{Source: "web", Count: 1, Contract: c}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("secrets with no broker: %v, want ErrUnsupported", err)
	}
}
