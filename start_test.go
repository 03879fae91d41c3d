package vmfork

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestDeriveStopReason(t *testing.T) {
	for _, c := range []struct {
		recorded           State
		reason             StopReason
		restarted, ramGone bool
		want               StopReason
	}{
		{StateStopped, StopByUser, false, false, StopByUser},
		{StateStopped, StopByUser, true, true, StopByUser}, // stopped before the restart: still the user's
		{StateStopped, StopHostRestart, false, false, StopHostRestart},
		{StateStopped, "", false, false, ""}, // an older record: vmfork cannot tell
		{StateRunning, "", false, false, StopQEMUDied},
		{StatePaused, "", false, false, StopQEMUDied},
		{StateRunning, "", true, false, StopHostRestart},
		{StateRunning, "", false, true, StopHostRestart},
		{StatePooled, "", false, true, StopHostRestart},
	} {
		if got := deriveStopReason(c.recorded, c.reason, c.restarted, c.ramGone); got != c.want {
			t.Errorf("deriveStopReason(%s, %q, restarted %v, RAM gone %v) = %q, want %q", c.recorded, c.reason, c.restarted, c.ramGone, got, c.want)
		}
	}
	for _, r := range []StopReason{StopByUser, StopQEMUDied, StopHostRestart} {
		if r.Text() == "" {
			t.Errorf("reason %q has no text for ls", r)
		}
	}
}

// A machine that vmfork stopped says so; one whose QEMU died says that,
// or that the host restarted when its RAM file left the mem dir with it.
func TestStopReasons(t *testing.T) {
	mg, d := newHibManager(t)
	ctx := t.Context()
	for _, n := range []string{"user", "died", "restart"} {
		bootFake(t, mg, n)
		m, _ := mg.Store.LoadMachine(n)
		if m.HostBoot == "" || m.HostBoot != hostBootID() {
			t.Errorf("%s: host boot %q, want this boot's %q", n, m.HostBoot, hostBootID())
		}
		if err := os.WriteFile(m.Paths.RAM, nil, 0o600); err != nil { // as QEMU's own
			t.Fatal(err)
		}
	}
	if _, err := mg.Stop(ctx, "user", false); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	delete(d.running, "died")
	delete(d.running, "restart")
	d.mu.Unlock()
	os.Remove(mg.Store.MachinePaths("restart").RAM)
	ms, err := mg.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]StopReason{"user": StopByUser, "died": StopQEMUDied, "restart": StopHostRestart}
	for _, m := range ms {
		if m.State != StateStopped || m.StopReason != want[m.Name] {
			t.Errorf("%s: %s, reason %q; want stopped, %q", m.Name, m.State, m.StopReason, want[m.Name])
		}
	}
	// Stopping one that died keeps why it stopped.
	m, err := mg.Stop(ctx, "died", false)
	if err != nil || m.StopReason != StopQEMUDied {
		t.Errorf("stop of a dead machine: %+v, %v; want its reason kept", m, err)
	}
	// A record saved under another boot says the host restarted.
	m, _ = mg.Store.LoadMachine("user")
	m.State, m.HostBoot = StateRunning, "another-boot"
	if err := writeJSON(mg.Store.MachinePaths("user").Dir+"/"+fileMachine, m); err != nil {
		t.Fatal(err)
	}
	if m, _ := mg.Get(ctx, "user"); m.StopReason != StopHostRestart {
		t.Errorf("a machine that ran under another boot: reason %q, want %q", m.StopReason, StopHostRestart)
	}
}

// start boots a stopped machine again as the same machine, and refuses
// what is not a stopped machine of its own.
func TestStart(t *testing.T) {
	mg, d := newHibManager(t)
	ctx := t.Context()
	bootFake(t, mg, "web")
	bootFake(t, mg, "sleepy")
	before, _ := mg.Store.LoadMachine("web")
	if _, err := mg.Start(ctx, "web"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "running already") {
		t.Errorf("start of a running machine: %v, want ErrInvalid", err)
	}
	if _, err := mg.Stop(ctx, "web", false); err != nil {
		t.Fatal(err)
	}
	res, err := mg.Start(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := mg.Get(ctx, "web")
	if m.State != StateRunning || !d.running["web"] || m.StopReason != "" || res.PID != m.PID || res.MAC != before.Spec.MAC {
		t.Errorf("after start: %+v (result %+v), want it running with its MAC %s", m, res, before.Spec.MAC)
	}
	if m.Spec.MAC != before.Spec.MAC || !reflect.DeepEqual(m.Paths, before.Paths) || m.Family != before.Family || m.Created != before.Created {
		t.Errorf("start changed the machine: %+v, was %+v", m, before)
	}
	if _, err := mg.Hibernate(ctx, "sleepy"); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Keep(ctx, KeepRequest{Source: "web", Name: "golden"}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]error{"sleepy": ErrInvalid, "golden": ErrInvalid, "nope": ErrNotFound, "Bad_Name": ErrInvalid} {
		if _, err := mg.Start(ctx, name); !errors.Is(err, want) {
			t.Errorf("start %s: %v, want %v", name, err, want)
		}
	}
	if _, err := mg.Start(ctx, "golden"); err == nil || !strings.Contains(err.Error(), "kept template") {
		t.Errorf("start of a kept template: %v, want it named a template", err)
	}
}

// After a host restart: the children of a live fork start with RAM files
// of their own, a kept template that held RAM is refused and given up by
// gc, and a stopped machine's disk stays.
func TestHostRestart(t *testing.T) {
	mg, d := newHibManager(t)
	ctx := t.Context()
	bootFake(t, mg, "web")
	if _, err := mg.Keep(ctx, KeepRequest{Source: "web", Name: "golden"}); err != nil {
		t.Fatal(err)
	}
	res, err := mg.Fork(ctx, ForkRequest{Source: "golden", Count: 1, Identity: quietChain})
	if err != nil {
		t.Fatal(err)
	}
	child := res.Children[0].Name
	golden, _ := mg.Store.FindKept("golden")
	if st := mg.templateStatus(ctx, golden, nil); st.Children != 1 || st.RAMLost {
		t.Fatalf("golden before the restart: %+v, want one child, RAM held", st)
	}
	// The restart: every QEMU gone, the mem dir empty.
	d.mu.Lock()
	clear(d.running)
	d.mu.Unlock()
	ents, _ := os.ReadDir(mg.Store.MemDir)
	for _, e := range ents {
		os.Remove(mg.Store.MemDir + "/" + e.Name())
	}
	c, _ := mg.Get(ctx, child)
	if c.State != StateStopped || c.StopReason != StopHostRestart {
		t.Errorf("child after the restart: %s, %q; want stopped by the host's restart", c.State, c.StopReason)
	}
	if st := mg.templateStatus(ctx, golden, nil); !st.RAMLost || st.Children != 0 {
		t.Errorf("golden after the restart: %+v, want its RAM lost, no child", st)
	}
	if _, err := mg.Fork(ctx, ForkRequest{Source: "golden", Count: 1, Identity: quietChain}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "lost its RAM") {
		t.Errorf("fork of a template whose RAM was lost: %v, want it refused", err)
	}
	c.Identity = nil // the fake driver has no agent to put it back through
	if err := mg.Store.SaveMachine(c); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Start(ctx, child); err != nil {
		t.Fatal(err)
	}
	c, _ = mg.Get(ctx, child)
	if !c.Paths.RAMShared || c.Paths.RAM != mg.Store.MachinePaths(child).RAM || c.mapsTemplate() {
		t.Errorf("started child's RAM: %s (shared %v), want its own file", c.Paths.RAM, c.Paths.RAMShared)
	}
	if _, err := mg.Start(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	gc, err := mg.GC(ctx)
	if err != nil || len(gc.Lost) != 1 || gc.Lost[0] != "golden" {
		t.Errorf("gc: %+v, %v; want golden given up", gc, err)
	}
	if _, err := mg.Store.FindKept("golden"); !errors.Is(err, ErrNotFound) {
		t.Errorf("golden after gc: %v, want it given up", err)
	}
}

// A resumed machine keeps the identity its record holds: ls showed its
// hostname as "-" after a resume, whose chain runs only the clock step.
func TestResumeKeepsIdentity(t *testing.T) {
	mg, _ := newHibManager(t)
	ctx := t.Context()
	bootFake(t, mg, "web")
	m, _ := mg.Store.LoadMachine("web")
	m.Identity = &IdentityResult{Hostname: "web-7", MachineID: "0123456789abcdef0123456789abcdef"}
	if err := mg.Store.SaveMachine(m); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Hibernate(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Resume(ctx, ResumeRequest{Machine: "web", Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	m, _ = mg.Store.LoadMachine("web")
	if m.Identity == nil || m.Identity.Hostname != "web-7" || m.Identity.MachineID != "0123456789abcdef0123456789abcdef" {
		t.Errorf("identity after resume: %+v, want the machine's own", m.Identity)
	}
}

// TestStartAdmission: a start the host has no room for is refused in its
// plan, dry run and real run alike, and the machine stays stopped.
func TestStartAdmission(t *testing.T) {
	mg, d := newHibManager(t)
	ctx := t.Context()
	bootFake(t, mg, "web")
	if _, err := mg.Stop(ctx, "web", false); err != nil {
		t.Fatal(err)
	}
	mg.Host = hostOf(mg.Store, 8*gib, 1*gib)
	m, _ := mg.Store.LoadMachine("web")
	m.Spec.MemoryMiB = 4096
	if err := mg.Store.SaveMachine(m); err != nil {
		t.Fatal(err)
	}
	_, errs := mg.PlanStart(ctx, []string{"web"})
	_, err := mg.Start(ctx, "web")
	for what, e := range map[string]error{"dry run": errs[0], "start": err} {
		if !errors.Is(e, ErrNoRoom) || !strings.Contains(e.Error(), `start "web": not enough room: memory`) {
			t.Errorf("%s of a 4 GiB machine on 1 GiB available: %v, want ErrNoRoom", what, e)
		}
	}
	if got, _ := mg.Get(ctx, "web"); got.State != StateStopped || d.running["web"] {
		t.Errorf("after a refused start: %s (running %v), want stopped", got.State, d.running["web"])
	}
}
