package vmfork

import (
	"context"
	"errors"
	"github.com/vmfork/vmfork/contract"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/customize"
)

// parityState makes the machines and templates every parity row starts
// from, on the hibernating fake driver (forks, pools, in-place starts):
//
//	web     running                      db      stopped
//	sleepy  hibernated                   golden  kept template of web's instant
//	disk    kept template of db's disk   (a disk-only one: children boot)
//	web-cp1 a checkpoint of web          other   running; other-cp1 its checkpoint
func parityState(t *testing.T) *Manager {
	t.Helper()
	mg, _ := newHibManager(t)
	// An 8 GiB host with 6 GiB available: room for the good rows, not for
	// the admission rows' hundred children (admission.go).
	mg.Host = hostOf(mg.Store, 8*gib, 6*gib)
	for _, n := range []string{"web", "db", "sleepy", "other"} {
		bootFake(t, mg, n)
	}
	ctx := t.Context()
	if _, err := mg.Stop(ctx, "db", true); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Hibernate(ctx, "sleepy"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []KeepRequest{{Source: "web", Name: "golden"}, {Source: "db", Name: "disk"}} {
		if _, err := mg.Keep(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []string{"web", "other"} {
		if _, err := mg.Checkpoint(ctx, CheckpointRequest{Machine: m, Identity: quietChain}); err != nil {
			t.Fatal(err)
		}
	}
	return mg
}

// parityRow is one request run both ways: plan is the dry run, apply the
// real run, returning the names of the machines it made or removed.
type parityRow struct {
	name  string
	plan  func(ctx context.Context, mg *Manager) (*Plan, error)
	apply func(ctx context.Context, mg *Manager) ([]string, error)
}

func forkRow(name string, req ForkRequest) parityRow {
	if req.Identity.Edit == nil {
		req.Identity.Edit = quietChain.Edit
	}
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) { return mg.PlanFork(ctx, req) },
		func(ctx context.Context, mg *Manager) ([]string, error) {
			res, err := mg.Fork(ctx, req)
			var names []string
			if res != nil {
				for _, c := range res.Children {
					names = append(names, c.Name)
				}
			}
			return names, err
		}}
}

func keepRow(name string, req KeepRequest) parityRow {
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) { return mg.PlanKeep(ctx, req) },
		func(ctx context.Context, mg *Manager) ([]string, error) { _, err := mg.Keep(ctx, req); return nil, err }}
}

func checkpointRow(name string, req CheckpointRequest) parityRow {
	req.Identity = quietChain
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) { return mg.PlanCheckpoint(ctx, req) },
		func(ctx context.Context, mg *Manager) ([]string, error) {
			_, err := mg.Checkpoint(ctx, req)
			return nil, err
		}}
}

func rewindRow(name string, req RewindRequest) parityRow {
	req.Identity = quietChain
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) { return mg.PlanRewind(ctx, req) },
		func(ctx context.Context, mg *Manager) ([]string, error) {
			_, err := mg.Rewind(ctx, req)
			return []string{req.Machine}, err
		}}
}

func hibernateRow(name, machine string) parityRow {
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) { return mg.PlanHibernate(ctx, machine) },
		func(ctx context.Context, mg *Manager) ([]string, error) {
			_, err := mg.Hibernate(ctx, machine)
			return []string{machine}, err
		}}
}

func resumeRow(name, machine string) parityRow {
	req := ResumeRequest{Machine: machine, Identity: quietChain}
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) { return mg.PlanResume(ctx, req) },
		func(ctx context.Context, mg *Manager) ([]string, error) {
			_, err := mg.Resume(ctx, req)
			return []string{machine}, err
		}}
}

func bootRow(name, machine string, spec func(t *testing.T) Spec) parityRow {
	return bootContractRow(name, machine, spec, nil)
}

func bootContractRow(name, machine string, spec func(t *testing.T) Spec, c *contract.Contract) parityRow {
	var s Spec
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) {
			return mg.PlanBoot(ctx, BootRequest{Name: machine, Spec: s, Contract: c})
		},
		func(ctx context.Context, mg *Manager) ([]string, error) {
			_, err := mg.Boot(ctx, BootRequest{Name: machine, Spec: s, Contract: c})
			return []string{machine}, err
		}}.withSpec(&s, spec)
}

// withSpec lets a boot row build its spec (files in a temp dir) when it runs.
func (r parityRow) withSpec(s *Spec, spec func(t *testing.T) Spec) parityRow {
	plan := r.plan
	r.plan = func(ctx context.Context, mg *Manager) (*Plan, error) {
		*s = spec(testOf(ctx))
		return plan(ctx, mg)
	}
	return r
}

func removeRow(name, machine string, force bool) parityRow {
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) {
			p, errs := mg.PlanRemove(ctx, []string{machine}, force)
			return p, errs[0]
		},
		func(ctx context.Context, mg *Manager) ([]string, error) {
			return []string{machine}, mg.Remove(ctx, machine, force)
		}}
}

func stopRow(name, machine string) parityRow {
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) {
			p, errs := mg.PlanStop(ctx, []string{machine}, true)
			return p, errs[0]
		},
		func(ctx context.Context, mg *Manager) ([]string, error) {
			_, err := mg.Stop(ctx, machine, true)
			return []string{machine}, err
		}}
}

func startRow(name, machine string) parityRow {
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) {
			p, errs := mg.PlanStart(ctx, []string{machine})
			return p, errs[0]
		},
		func(ctx context.Context, mg *Manager) ([]string, error) {
			_, err := mg.Start(ctx, machine)
			return []string{machine}, err
		}}
}

func poolRow(name, tpl string, size int) parityRow {
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) { return mg.PlanPool(ctx, tpl, size) },
		func(ctx context.Context, mg *Manager) ([]string, error) {
			_, err := mg.SetPool(ctx, tpl, size)
			return nil, err
		}}
}

func unkeepRow(name, tpl string) parityRow {
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) { return mg.PlanUnkeep(ctx, tpl) },
		func(ctx context.Context, mg *Manager) ([]string, error) {
			_, err := mg.Unkeep(ctx, tpl)
			return nil, err
		}}
}

func exploreRow(name string, req ExploreRequest) parityRow {
	return parityRow{name,
		func(ctx context.Context, mg *Manager) (*Plan, error) { return mg.PlanExplore(ctx, req) },
		func(ctx context.Context, mg *Manager) ([]string, error) {
			_, err := mg.Explore(ctx, req)
			return nil, err
		}}
}

type testKey struct{}

func testOf(ctx context.Context) *testing.T { return ctx.Value(testKey{}).(*testing.T) }

func kernelSpec(t *testing.T) Spec {
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Spec{Kernel: kernel, MemoryMiB: 256, CPUs: 1}
}

// badParity is every bad request the parity test runs both ways: the dry
// run and the real run must refuse it with the same error, and neither
// may change anything. A check added to an apply instead of its plan
// fails a row here once the row for its input is added.
var badParity = []parityRow{
	forkRow("fork count zero", ForkRequest{Source: "web"}),
	forkRow("fork over the limit", ForkRequest{Source: "web", Count: 3, MaxChildren: 2}),
	forkRow("fork child name taken", ForkRequest{Source: "web", Names: []string{"db"}}),
	forkRow("fork child name of a kept template", ForkRequest{Source: "web", Names: []string{"golden"}}),
	forkRow("fork child name twice", ForkRequest{Source: "web", Names: []string{"a", "a"}}),
	forkRow("fork child named as its source", ForkRequest{Source: "web", Names: []string{"web"}}),
	forkRow("fork child name invalid", ForkRequest{Source: "web", Names: []string{"UPPER"}}),
	forkRow("fork names and count differ", ForkRequest{Source: "web", Names: []string{"a", "b"}, Count: 3}),
	forkRow("fork of nothing", ForkRequest{Source: "nope", Count: 1}),
	forkRow("fork source name invalid", ForkRequest{Source: "No_Such", Count: 1}),
	forkRow("fork hostname pattern", ForkRequest{Source: "web", Count: 2, Identity: IdentityOptions{Spec: customize.Spec{Hostname: "web-{x}"}}}),
	forkRow("fork negative TTL", ForkRequest{Source: "web", Count: 1, TTL: -time.Second}),
	forkRow("fork static addresses too few", ForkRequest{Source: "web", Count: 2, Identity: IdentityOptions{Spec: customize.Spec{
		Network: customize.NetworkSpec{Mode: customize.NetworkStatic, Addresses: []string{"10.0.0.5/24"}}}}}),
	forkRow("fork of a kept template, over the limit", ForkRequest{Source: "golden", Count: 5, MaxChildren: 4}),
	forkRow("fork of a hibernated machine, name taken", ForkRequest{Source: "sleepy", Names: []string{"web"}}),
	forkRow("fork --disk-only of a stopped machine", ForkRequest{Source: "db", Count: 1, DiskOnly: true}),
	forkRow("fork --disk-only of a kept template", ForkRequest{Source: "golden", Count: 1, DiskOnly: true}),
	forkRow("fork --disk-only of a hibernated machine", ForkRequest{Source: "sleepy", Count: 1, DiskOnly: true}),
	forkRow("fork --disk-only of a machine without a disk", ForkRequest{Source: "web", Count: 1, DiskOnly: true}),
	forkRow("fork --disk-only count zero", ForkRequest{Source: "web", DiskOnly: true}),
	keepRow("save under a machine's name", KeepRequest{Source: "web", Name: "db"}),
	keepRow("save under a kept name", KeepRequest{Source: "web", Name: "golden"}),
	keepRow("save name invalid", KeepRequest{Source: "web", Name: "Bad"}),
	keepRow("save pool too big", KeepRequest{Source: "web", Name: "t2", Pool: MaxPoolSize + 1}),
	keepRow("save stopped with a pool", KeepRequest{Source: "db", Name: "t2", Pool: 1}),
	keepRow("save of nothing", KeepRequest{Source: "nope", Name: "t2"}),
	keepRow("save of a hibernated machine", KeepRequest{Source: "sleepy", Name: "t2"}),
	checkpointRow("checkpoint of a stopped machine", CheckpointRequest{Machine: "db"}),
	checkpointRow("checkpoint of nothing", CheckpointRequest{Machine: "nope"}),
	checkpointRow("checkpoint as a taken name", CheckpointRequest{Machine: "web", As: "golden"}),
	rewindRow("rewind to nothing", RewindRequest{Machine: "web", To: "nope"}),
	rewindRow("rewind to another's checkpoint", RewindRequest{Machine: "web", To: "other-cp1"}),
	rewindRow("rewind to a disk-only template", RewindRequest{Machine: "db", To: "disk", Force: true}),
	rewindRow("rewind of nothing", RewindRequest{Machine: "nope", To: "web-cp1"}),
	hibernateRow("hibernate a stopped machine", "db"),
	hibernateRow("hibernate twice", "sleepy"),
	hibernateRow("hibernate nothing", "nope"),
	resumeRow("resume a running machine", "web"),
	resumeRow("resume nothing", "nope"),
	bootRow("boot a taken name", "web", kernelSpec),
	bootRow("boot a kept template's name", "golden", kernelSpec),
	bootRow("boot an invalid name", "Bad_Name", kernelSpec),
	bootRow("boot without a kernel", "new", func(*testing.T) Spec { return Spec{Kernel: "/nonexistent/vmlinuz", MemoryMiB: 256, CPUs: 1} }),
	removeRow("rm nothing", "nope", false),
	removeRow("rm an invalid name", "a/b", false),
	stopRow("stop a hibernated machine", "sleepy"),
	stopRow("stop nothing", "nope"),
	startRow("start a running machine", "web"),
	startRow("start a hibernated machine", "sleepy"),
	startRow("start a kept template", "golden"),
	startRow("start nothing", "nope"),
	startRow("start an invalid name", "a/b"),
	poolRow("pool of nothing", "nope", 1),
	poolRow("pool size negative", "golden", -1),
	poolRow("pool of a disk-only template", "disk", 1),
	unkeepRow("template rm of nothing", "nope"),
	unkeepRow("template rm of a machine", "web"),
	exploreRow("explore with no tries", ExploreRequest{Source: "web"}),
	exploreRow("explore of nothing", ExploreRequest{Source: "nope", Tries: []string{"true"}}),
	exploreRow("explore keep-as taken", ExploreRequest{Source: "web", Tries: []string{"true"}, KeepAs: "db"}),
	forkRow("fork with a contract the driver cannot enforce", ForkRequest{Source: "web", Count: 1, Contract: dnsNone}),
	forkRow("fork of a kept template with a contract the driver cannot enforce", ForkRequest{Source: "golden", Count: 1, Contract: dnsNone}),
	keepRow("save with a contract the driver cannot enforce", KeepRequest{Source: "web", Name: "t2", Contract: dnsNone}),
	checkpointRow("checkpoint with a contract the driver cannot enforce", CheckpointRequest{Machine: "web", Contract: dnsNone}),
	bootContractRow("boot with a contract the driver cannot enforce", "new", kernelSpec, dnsNone),
	exploreRow("explore with a contract the driver cannot enforce", ExploreRequest{Source: "web", Tries: []string{"true"}, Contract: dnsNone}),
	// Admission: 100 x 256 MiB is more than (6 GiB - a reserve) x 2.
	forkRow("fork the host has no room for", ForkRequest{Source: "web", Count: 100}),
	forkRow("fork of a kept template the host has no room for", ForkRequest{Source: "golden", Count: 100}),
	forkRow("fork of a hibernated machine the host has no room for", ForkRequest{Source: "sleepy", Count: 100}),
	forkRow("fork of a stopped machine the host has no room for", ForkRequest{Source: "db", Count: 100}),
	exploreRow("explore the host has no room for", ExploreRequest{Source: "web", Tries: slices.Repeat([]string{"true"}, 100), MaxChildren: 128}),
	poolRow("pool the host has no room for", "golden", 60),
	keepRow("save with a pool the host has no room for", KeepRequest{Source: "web", Name: "t2", Pool: 60}),
}

// dnsNone is a contract the hibernating fake driver cannot enforce.
var dnsNone = &contract.Contract{Network: &contract.Network{Egress: contract.Egress{Mode: contract.EgressAll}, DNS: contract.DNSNone, Connections: contract.ConnReset}}

// egressNone is one it enforces.
var egressNone = &contract.Contract{Network: &contract.Network{Egress: contract.Egress{Mode: contract.EgressNone}, DNS: contract.DNSHost, Connections: contract.ConnReset}}

// goodParity is every good request the parity test runs both ways: the dry
// run succeeds and changes nothing, the real run succeeds, and it made or
// removed the machines the plan named.
var goodParity = []parityRow{
	forkRow("fork a running machine", ForkRequest{Source: "web", Count: 2}),
	forkRow("fork a stopped machine", ForkRequest{Source: "db", Names: []string{"db-a"}}),
	forkRow("fork a kept template", ForkRequest{Source: "golden", Count: 2, TTL: time.Hour}),
	forkRow("fork a disk-only kept template", ForkRequest{Source: "disk", Count: 1}),
	forkRow("fork a hibernated machine", ForkRequest{Source: "sleepy", Count: 2}),
	keepRow("save a running machine", KeepRequest{Source: "web", Name: "t2", Pool: 1}),
	keepRow("save a stopped machine", KeepRequest{Source: "db", Name: "t2"}),
	checkpointRow("checkpoint", CheckpointRequest{Machine: "web"}),
	rewindRow("rewind to its own checkpoint", RewindRequest{Machine: "web", To: "web-cp1"}),
	rewindRow("rewind to another's checkpoint, forced", RewindRequest{Machine: "web", To: "other-cp1", Force: true}),
	hibernateRow("hibernate", "web"),
	resumeRow("resume", "sleepy"),
	bootRow("boot", "new", kernelSpec),
	removeRow("rm a running machine", "web", false),
	removeRow("rm a hibernated machine", "sleepy", false),
	stopRow("stop", "web"),
	startRow("start", "db"),
	poolRow("pool", "golden", 2),
	unkeepRow("template rm", "golden"),
	forkRow("fork with a contract", ForkRequest{Source: "web", Count: 2, Contract: egressNone}),
	keepRow("save with a contract", KeepRequest{Source: "web", Name: "t2", Contract: egressNone}),
	bootContractRow("boot with a contract", "new", kernelSpec, egressNone),
}

// TestPlanParity runs every row of the bad-input and good-request tables
// as a dry run and as the real run, each on a fresh state.
func TestPlanParity(t *testing.T) {
	run := func(t *testing.T, r parityRow, good bool) {
		ctx := context.WithValue(t.Context(), testKey{}, t)
		mg := parityState(t)
		before := stateTree(t, mg.Store)
		p, perr := r.plan(ctx, mg)
		if got := stateTree(t, mg.Store); got != before {
			t.Fatalf("the dry run changed the state dir:\n%s\nwant:\n%s", got, before)
		}
		names, aerr := r.apply(ctx, mg)
		switch {
		case !good && (perr == nil || aerr == nil || perr.Error() != aerr.Error()):
			t.Fatalf("dry run: %v; real run: %v; want the same error", perr, aerr)
		case !good && strings.Contains(r.name, "no room") && !errors.Is(aerr, ErrNoRoom):
			t.Fatalf("refused with %v, want admission's ErrNoRoom", aerr)
		case !good:
			// The real run may leave the lock files it took (flock files,
			// made once per name and kept), and nothing else.
			if got := withoutLocks(stateTree(t, mg.Store)); got != withoutLocks(before) {
				t.Errorf("the refused real run changed the state dir:\n%s\nwant:\n%s", got, withoutLocks(before))
			}
		case perr != nil || aerr != nil:
			t.Fatalf("dry run: %v; real run: %v; want both to succeed", perr, aerr)
		case !p.DryRun || len(p.Actions) == 0:
			t.Errorf("plan %+v: want a dry run that says what it does", p)
		default:
			var planned []string
			for _, c := range p.Children {
				planned = append(planned, c.Name)
			}
			planned = append(planned, p.Machines...)
			if len(names) > 0 && !slices.Equal(planned, names) {
				t.Errorf("the plan named %v, the real run %v", planned, names)
			}
		}
	}
	for _, r := range badParity {
		t.Run("bad/"+strings.ReplaceAll(r.name, " ", "_"), func(t *testing.T) { run(t, r, false) })
	}
	for _, r := range goodParity {
		t.Run("good/"+strings.ReplaceAll(r.name, " ", "_"), func(t *testing.T) { run(t, r, true) })
	}
}

// withoutLocks drops the lock directory's lines from a stateTree.
func withoutLocks(tree string) string {
	var out []string
	for _, l := range strings.Split(tree, "\n") {
		if !strings.HasPrefix(l, "/"+dirLocks) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
