package vmfork

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vmfork/vmfork/customize"
)

// linkDriver is the fake driver with a NIC link to switch.
type linkDriver struct {
	*fakeDriver
	mu    sync.Mutex
	links []string // "name up" or "name down", in order
}

func (d *linkDriver) SetLink(_ context.Context, m *Machine, up bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	state := "down"
	if up {
		state = "up"
	}
	d.links = append(d.links, m.Name+" "+state)
	return nil
}

// Freeze implements Forker. The fake source has no disk; the template then
// has none either.
func (d *linkDriver) Freeze(ctx context.Context, src *Machine, t *Template, opts FreezeOptions) (FreezeResult, error) {
	if src.Spec.Disk == "" {
		t.Paths.Disk = ""
	}
	return d.fakeDriver.Freeze(ctx, src, t, opts)
}

// chainOf replaces the identity chain with steps; the fake driver has no
// guest agent for the real one.
func chainOf(steps ...customize.Step) func(customize.Chain) customize.Chain {
	return func(customize.Chain) customize.Chain { return customize.NewChain(steps...) }
}

func TestPrepareIdentity(t *testing.T) {
	mg, _ := newTestManager(t)
	tpl := &Template{ID: "web.1", HasMemory: true, VMGenID: "99999999-2222-4333-8444-555555555555", Spec: Spec{MAC: "52:54:00:00:00:01"}}
	a, b := &Machine{Name: "web-1", Parent: "web"}, &Machine{Name: "web-2", Parent: "web"}
	if err := mg.prepareIdentity(a, tpl, 1, IdentityOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := mg.prepareIdentity(b, tpl, 2, IdentityOptions{}); err != nil {
		t.Fatal(err)
	}
	if a.VMGenID == "" || a.VMGenID == tpl.VMGenID || a.VMGenID == b.VMGenID || len(a.VMGenID) != 36 {
		t.Errorf("fresh vmgenids %q and %q, template %q: want new, distinct UUIDs", a.VMGenID, b.VMGenID, tpl.VMGenID)
	}
	if !strings.HasPrefix(a.GuestMAC, "52:54:00:") || a.GuestMAC == b.GuestMAC || a.GuestMAC == tpl.Spec.MAC {
		t.Errorf("guest MACs %q and %q: want distinct ones, not the template's", a.GuestMAC, b.GuestMAC)
	}
	// Each fork's first child is index 1: children of one kept template
	// forked one at a time get MACs of their own, and none that a machine
	// in the store has.
	f1, f2 := IdentityOptions{forkNonce: "fork-1"}, IdentityOptions{forkNonce: "fork-2"}
	c1, c2, c3 := &Machine{Name: "c1", Parent: "web"}, &Machine{Name: "c2", Parent: "web"}, &Machine{Name: "c3", Parent: "web"}
	for _, x := range []struct {
		m *Machine
		o IdentityOptions
	}{{c1, f1}, {c2, f2}, {c3, f1}} {
		if err := mg.prepareIdentity(x.m, tpl, 1, x.o); err != nil {
			t.Fatal(err)
		}
	}
	if c1.GuestMAC == c2.GuestMAC || c1.GuestMAC != c3.GuestMAC {
		t.Errorf("index 1 of forks 1, 2 and 1 again: MACs %s %s %s, want the two forks' to differ", c1.GuestMAC, c2.GuestMAC, c3.GuestMAC)
	}
	c1.Spec.MAC = tpl.Spec.MAC
	if err := mg.Store.CreateMachine(c1); err != nil {
		t.Fatal(err)
	}
	if err := mg.prepareIdentity(c3, tpl, 1, f1); err != nil || c3.GuestMAC == c1.GuestMAC {
		t.Errorf("MAC %s (%v): want one that %s, in the store, does not have", c3.GuestMAC, err, c1.Name)
	}
	repro := IdentityOptions{Spec: customize.Spec{Identity: customize.ModeReproducible}, forkNonce: "fork-1"}
	r1, r2 := &Machine{Name: "r1", Parent: "web"}, &Machine{Name: "r2", Parent: "web"}
	mg.prepareIdentity(r1, tpl, 1, repro)
	repro.forkNonce = "fork-2"
	mg.prepareIdentity(r2, tpl, 1, repro)
	if r1.GuestMAC != r2.GuestMAC {
		t.Errorf("reproducible identity: MACs %s and %s for index 1 of two forks, want the same", r1.GuestMAC, r2.GuestMAC)
	}
	if err := mg.prepareIdentity(a, tpl, 1, repro); err != nil || a.VMGenID != tpl.VMGenID {
		t.Errorf("reproducible vmgenid %q, %v; want the template's", a.VMGenID, err)
	}
	tpl.VMGenID = ""
	if err := mg.prepareIdentity(a, tpl, 1, repro); err == nil {
		t.Errorf("reproducible identity from a template without a vmgenid: no error")
	}
}

func TestIdentityOptionsValidate(t *testing.T) {
	bad := IdentityOptions{Spec: customize.Spec{Hostname: "web_{n}"}}
	if err := bad.Validate(); !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "identity: ") {
		t.Errorf("Validate = %v, want an identity error wrapping ErrInvalid", err)
	}
	static := IdentityOptions{Spec: customize.Spec{Network: customize.NetworkSpec{Addresses: []string{"10.0.2.21/24"}}}}
	if err := static.ValidateFor(2); !errors.Is(err, ErrInvalid) {
		t.Errorf("ValidateFor(2) with one address = %v", err)
	}
}

func TestForkIdentityRaisesTheLinkAfterTheChain(t *testing.T) {
	mg, fd := newTestManager(t)
	d := &linkDriver{fakeDriver: fd}
	mg.Driver = d
	bootFake(t, mg, "src")
	ran := false
	step := customize.Step{Name: "t.step", Fn: func(_ context.Context, env *customize.Env) error {
		ran = true
		if env.Child.Name != "src-1" || env.Child.Index != 1 || env.Child.MAC == "" {
			t.Errorf("child = %+v", env.Child)
		}
		return nil
	}}
	res, err := mg.Fork(t.Context(), ForkRequest{Source: "src", Count: 1, Identity: IdentityOptions{Edit: chainOf(step)}})
	if err != nil {
		t.Fatal(err)
	}
	if !ran || res.Children[0].Identity == nil || res.Children[0].Identity.Steps[0].Status != customize.StatusOK {
		t.Errorf("identity = %+v, want the chain's result", res.Children[0].Identity)
	}
	if !slices.Equal(d.links, []string{"src-1 up"}) {
		t.Errorf("links = %v, want src-1 up once, after the chain", d.links)
	}
	c, err := mg.Store.LoadMachine("src-1")
	if err != nil || c.Identity == nil || c.GuestMAC == "" || c.VMGenID == "" {
		t.Errorf("child record = %+v, %v; want its identity, guest MAC and vmgenid", c, err)
	}
}

func TestForkIdentityFailureKeepsTheLinkDown(t *testing.T) {
	mg, fd := newTestManager(t)
	d := &linkDriver{fakeDriver: fd}
	mg.Driver = d
	bootFake(t, mg, "src")
	fail := customize.Step{Name: "t.fail", Fn: func(_ context.Context, env *customize.Env) error {
		if env.Child.Index == 2 {
			return errors.New("injected")
		}
		return nil
	}}
	opts := IdentityOptions{Edit: chainOf(fail), KeepOnFailure: true}
	res, err := mg.Fork(t.Context(), ForkRequest{Source: "src", Count: 2, Identity: opts})
	if !errors.Is(err, ErrPartial) {
		t.Fatalf("Fork = %v, want a partial success", err)
	}
	if len(res.Failed) != 1 || res.Failed[0].Error != `identity: step "t.fail": injected` || res.Failed[0].Identity == nil {
		t.Fatalf("failed = %+v", res.Failed)
	}
	slices.Sort(d.links)
	if !slices.Equal(d.links, []string{"src-1 up", "src-2 down"}) {
		t.Errorf("links = %v, want src-1 up and src-2 held down", d.links)
	}
	if got := machineNames(t, mg.Store); got != "src,src-1,src-2" {
		t.Errorf("machines = %s, want the failed child kept", got)
	}
	// Killed by default.
	opts.KeepOnFailure = false
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "src", Names: []string{"k-1", "k-2"}, Identity: opts}); !errors.Is(err, ErrPartial) {
		t.Fatalf("Fork = %v", err)
	}
	if got := machineNames(t, mg.Store); got != "k-1,src,src-1,src-2" {
		t.Errorf("machines = %s, want k-2 removed", got)
	}
}
