package vmfork

import (
	"context"
	"errors"
	"github.com/vmfork/vmfork/contract"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/customize"
)

// poolDriver is the fake driver with a warm pool. Prestarted processes run
// under their member's name until Complete hands them to a child.
type poolDriver struct {
	*linkDriver
	prestarted map[string]string // member dir -> member name
	nicMAC     map[string]string // member dir -> the MAC its NIC was configured with
	completed  []string          // children started from a member
	started    []string          // children started cold
}

func newPoolManager(t *testing.T) (*Manager, *poolDriver) {
	mg, fd := newTestManager(t)
	d := &poolDriver{linkDriver: &linkDriver{fakeDriver: fd}, prestarted: map[string]string{}, nicMAC: map[string]string{}}
	mg.Driver = d
	return mg, d
}

// Freeze records a vmgenid, as QEMU's would be.
func (d *poolDriver) Freeze(ctx context.Context, src *Machine, t *Template, opts FreezeOptions) (FreezeResult, error) {
	t.VMGenID = "11111111-2222-3333-4444-555555555555"
	fr, err := d.linkDriver.Freeze(ctx, src, t, opts)
	fr.Pause = 5 * time.Millisecond
	return fr, err
}

func (d *poolDriver) Prestart(ctx context.Context, m *Machine, t *Template) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fakeDriver.mu.Lock()
	defer d.fakeDriver.mu.Unlock()
	if m.Template != t.ID || m.Paths.RAM != t.Paths.RAM || m.Paths.RAMShared || m.VMGenID == "" {
		return errors.New("member record does not match its template")
	}
	d.running[m.Name] = true
	m.PID = 5000 + len(d.prestarted)
	d.prestarted[m.Paths.Dir] = m.Name
	d.nicMAC[m.Paths.Dir] = m.GuestMAC // what qemudrv's nicMAC configures
	return nil
}

func (d *poolDriver) Complete(ctx context.Context, c *Machine, t *Template) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fakeDriver.mu.Lock()
	defer d.fakeDriver.mu.Unlock()
	member, ok := d.prestarted[c.Paths.Dir]
	if !ok || !d.running[member] {
		return errors.New("no prestarted process in " + c.Paths.Dir)
	}
	delete(d.running, member)
	d.running[c.Name] = true
	d.completed = append(d.completed, c.Name)
	return nil
}

func (d *poolDriver) StartInPlace(ctx context.Context, c *Machine, t *Template) error {
	return d.StartChild(ctx, c, t)
}

func (d *poolDriver) StartChild(ctx context.Context, c *Machine, t *Template) error {
	d.mu.Lock()
	d.started = append(d.started, c.Name)
	d.mu.Unlock()
	return d.fakeDriver.StartChild(ctx, c, t)
}

// pooled counts the live members of template id.
func pooled(t *testing.T, mg *Manager, id string) int {
	t.Helper()
	ms, err := mg.Store.listPool(id)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range ms {
		if st, _ := mg.Driver.Status(t.Context(), m); st == StateRunning {
			n++
		}
	}
	return n
}

var quietChain = IdentityOptions{Edit: chainOf(customize.Step{Name: "t.ok", Fn: func(context.Context, *customize.Env) error { return nil }})}

func TestKeepThenForkTakesThePoolFirst(t *testing.T) {
	mg, d := newPoolManager(t)
	bootFake(t, mg, "src")
	tpl, err := mg.Keep(t.Context(), KeepRequest{Source: "src", Name: "golden", Pool: 2})
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Name != "golden" || !tpl.HasMemory || pooled(t, mg, tpl.ID) != 2 {
		t.Fatalf("kept %+v with %d pooled, want golden with memory and 2 pooled", tpl, pooled(t, mg, tpl.ID))
	}
	res, err := mg.Fork(t.Context(), ForkRequest{Source: "golden", Count: 3, Parallel: 1, Identity: quietChain})
	if err != nil {
		t.Fatal(err)
	}
	if res.Source != "golden" || res.Template != tpl.ID || len(res.Children) != 3 {
		t.Fatalf("result = %+v, want 3 children of golden from %s", res, tpl.ID)
	}
	if d.freezeSeen != 1 || tpl.PauseMS != 5 || res.PauseMS != 0 {
		t.Errorf("source frozen %d times (pause %v ms at the save, %v ms in the fork), want once, at the save",
			d.freezeSeen, tpl.PauseMS, res.PauseMS)
	}
	if len(d.completed) != 2 || len(d.started) != 1 {
		t.Errorf("from the pool %v, cold %v; want 2 and 1", d.completed, d.started)
	}
	macs := map[string]int{}
	for _, name := range d.completed {
		c, err := mg.Store.LoadMachine(name)
		if err != nil {
			t.Fatal(err)
		}
		if !mg.Store.inPool(c.Paths.Dir) || c.Template != tpl.ID || c.Parent != "src" || c.VMGenID == "" {
			t.Errorf("pooled child %+v: want its member's files, the template and src as parent", c)
		}
		// After a guest reset the NIC shows its configured MAC: it must be
		// the child's own, not the template's.
		if nic := d.nicMAC[c.Paths.Dir]; nic == "" || nic != c.GuestMAC || nic == tpl.Spec.MAC {
			t.Errorf("pooled child %s: NIC configured with %q, child's MAC %q, template's %q; want the child's own",
				c.Name, nic, c.GuestMAC, tpl.Spec.MAC)
		}
		macs[c.GuestMAC]++
	}
	for _, name := range d.started {
		c, err := mg.Store.LoadMachine(name)
		if err != nil {
			t.Fatal(err)
		}
		macs[c.GuestMAC]++
	}
	if len(macs) != 3 {
		t.Errorf("children's MACs %v, want 3 distinct", macs)
	}
	if n := pooled(t, mg, tpl.ID); n != 2 {
		t.Errorf("%d pooled after the fork, want the pool refilled to 2", n)
	}
	// A child made from a member takes the member's directory with it.
	c, _ := mg.Store.LoadMachine(d.completed[0])
	if err := mg.Remove(t.Context(), c.Name, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.Paths.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed child's pool directory %s still exists (%v)", c.Paths.Dir, err)
	}
}

func TestKeptTemplateSurvivesCollection(t *testing.T) {
	mg, _ := newPoolManager(t)
	bootFake(t, mg, "src")
	tpl, err := mg.Keep(t.Context(), KeepRequest{Source: "src", Name: "golden", Pool: 1})
	if err != nil {
		t.Fatal(err)
	}
	// A live fork collects templates without children; the kept one stays.
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "src", Count: 1, Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Store.LoadTemplate(tpl.ID); err != nil {
		t.Fatalf("kept template collected: %v", err)
	}
	// Given up with a child alive: it stays until the child is gone.
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "golden", Names: []string{"kid"}, Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	gone, err := mg.Unkeep(t.Context(), "golden")
	if err != nil || gone {
		t.Fatalf("Unkeep = %v, %v; want kept for its child", gone, err)
	}
	if _, err := mg.Store.FindKept("golden"); !errors.Is(err, ErrNotFound) {
		t.Errorf("FindKept after Unkeep = %v, want ErrNotFound", err)
	}
	if err := mg.Remove(t.Context(), "kid", true); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Store.LoadTemplate(tpl.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("template after its last child went: %v, want removed", err)
	}
	if dir := filepath.Join(mg.Store.poolRoot(), tpl.ID); exists(dir) {
		t.Errorf("pool directory %s left after its template went", dir)
	}
}

func TestKeepRefusesBadRequests(t *testing.T) {
	mg, d := newPoolManager(t)
	bootFake(t, mg, "src")
	bootFake(t, mg, "other")
	cases := []struct {
		req  KeepRequest
		want error
	}{
		{KeepRequest{Source: "src", Name: "other"}, ErrExists},
		{KeepRequest{Source: "src", Name: "Bad_Name"}, ErrInvalid},
		{KeepRequest{Source: "src", Name: "g", Pool: -1}, ErrInvalid},
		{KeepRequest{Source: "src", Name: "g", Pool: MaxPoolSize + 1}, ErrInvalid},
		{KeepRequest{Source: "nope", Name: "g"}, ErrNotFound},
	}
	for _, c := range cases {
		if _, err := mg.Keep(t.Context(), c.req); !errors.Is(err, c.want) {
			t.Errorf("Keep(%+v) = %v, want %v", c.req, err, c.want)
		}
	}
	if d.freezeSeen != 0 {
		t.Errorf("refused requests froze the source %d times", d.freezeSeen)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirTemplates)); n != 0 {
		t.Errorf("%d templates left by refused requests", n)
	}
	if _, err := mg.Keep(t.Context(), KeepRequest{Source: "src", Name: "golden"}); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Keep(t.Context(), KeepRequest{Source: "other", Name: "golden"}); !errors.Is(err, ErrExists) {
		t.Errorf("second template named golden: %v, want ErrExists", err)
	}
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	os.WriteFile(kernel, []byte("k"), 0o600)
	if _, err := mg.Boot(t.Context(), BootRequest{Name: "golden", Spec: Spec{Kernel: kernel, MemoryMiB: 256, CPUs: 1}}); !errors.Is(err, ErrExists) {
		t.Errorf("boot a machine named like a kept template: %v, want ErrExists", err)
	}
}

func TestKeepFreezeFailureKeepsNothing(t *testing.T) {
	mg, d := newPoolManager(t)
	bootFake(t, mg, "src")
	d.freezeErr = errors.New("injected freeze failure")
	if _, err := mg.Keep(t.Context(), KeepRequest{Source: "src", Name: "golden", Pool: 1}); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Keep = %v, want the freeze failure", err)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirTemplates)); n != 0 {
		t.Errorf("%d templates left", n)
	}
	if len(d.prestarted) != 0 {
		t.Errorf("pool members started for a failed freeze: %v", d.prestarted)
	}
}

func TestPoolResizeAndReproducibleForkStartsCold(t *testing.T) {
	mg, d := newPoolManager(t)
	bootFake(t, mg, "src")
	tpl, err := mg.Keep(t.Context(), KeepRequest{Source: "src", Name: "golden", Pool: 1})
	if err != nil {
		t.Fatal(err)
	}
	st, err := mg.SetPool(t.Context(), "golden", 3)
	if err != nil || st.Pooled != 3 || st.PoolSize != 3 {
		t.Fatalf("SetPool 3 = %+v, %v", st, err)
	}
	if st, err = mg.SetPool(t.Context(), "golden", 1); err != nil || st.Pooled != 1 {
		t.Fatalf("SetPool 1 = %+v, %v", st, err)
	}
	repro := quietChain
	repro.Spec.Identity = customize.ModeReproducible
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "golden", Count: 1, Identity: repro}); err != nil {
		t.Fatal(err)
	}
	if len(d.completed) != 0 || len(d.started) != 1 {
		t.Errorf("reproducible child from the pool %v / cold %v; want cold: members have fresh vmgenids", d.completed, d.started)
	}
	if _, err := mg.SetPool(t.Context(), "nope", 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetPool of an unknown template: %v, want ErrNotFound", err)
	}
	if _, err := mg.Unkeep(t.Context(), "golden"); err != nil {
		t.Fatal(err)
	}
	if n := pooled(t, mg, tpl.ID); n != 0 {
		t.Errorf("%d pool members alive after Unkeep", n)
	}
}

// A contract of guest steps alone (secret files) leaves the warm pool to
// serve its children; one the host enforces (egress) starts them cold.
func TestPoolServesGuestOnlyContracts(t *testing.T) {
	mg, d := newPoolManager(t)
	mg.Driver = enforcingPool{d}
	bootFake(t, mg, "src")
	if _, err := mg.Keep(t.Context(), KeepRequest{Source: "src", Name: "golden", Pool: 2}); err != nil {
		t.Fatal(err)
	}
	files := &contract.Contract{SecretFiles: &contract.SecretFiles{Wipe: []string{"/etc/app/session"}}}
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "golden", Count: 1, Identity: quietChain, Contract: files}); err != nil {
		t.Fatal(err)
	}
	if len(d.completed) != 1 || len(d.started) != 0 {
		t.Errorf("secret files only: from the pool %v, cold %v; want the pool's", d.completed, d.started)
	}
	if files.OnHost() {
		t.Error("a contract of secret files alone says the host enforces it")
	}
	for _, c := range []*contract.Contract{
		{Network: &contract.Network{Egress: contract.Egress{Mode: contract.EgressNone}}},
		{Network: &contract.Network{DNS: contract.DNSNone}},
		{Secrets: map[string]contract.Secret{"T": {Hosts: []string{"a.example"}}}},
	} {
		if !c.OnHost() {
			t.Errorf("%+v: OnHost() = false, want true", c)
		}
	}
}

// enforcingPool is the pool driver with host rules that always hold.
type enforcingPool struct{ *poolDriver }

func (enforcingPool) CheckContract(context.Context, *Machine, *contract.Contract) error { return nil }
func (enforcingPool) ApplyContract(context.Context, *Machine, *contract.Contract) error { return nil }
func (enforcingPool) DescribeContract(context.Context, *Machine) ([]string, error)      { return nil, nil }
