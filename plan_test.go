package vmfork

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/vmfork/vmfork/customize"
)

// stateTree lists every path under the state dir with its size, so a test
// can show that a plan changed nothing.
func stateTree(t *testing.T, s *Store) string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(s.StateDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, strings.TrimPrefix(p, s.StateDir)+" "+info.ModTime().String())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// A plan refuses exactly what the real fork refuses, with the same message.
func TestPlanForkRefusesWhatForkRefuses(t *testing.T) {
	mg, d := newTestManager(t)
	bootFake(t, mg, "src")
	bootFake(t, mg, "taken")
	cases := []ForkRequest{
		{Source: "src", Count: 0},
		{Source: "src", Count: 3, MaxChildren: 2},
		{Source: "src", Names: []string{"taken"}},
		{Source: "src", Names: []string{"a", "a"}},
		{Source: "src", Names: []string{"src"}},
		{Source: "src", Names: []string{"a", "b"}, Count: 3},
		{Source: "src", Names: []string{"UPPER"}},
		{Source: "nope", Count: 1},
		{Source: "src", Count: 2, Identity: IdentityOptions{Spec: customize.Spec{Hostname: "web-{x}"}}},
	}
	for _, req := range cases {
		before := stateTree(t, mg.Store)
		_, perr := mg.PlanFork(t.Context(), req)
		if got := stateTree(t, mg.Store); got != before {
			t.Errorf("PlanFork(%+v) changed the state dir:\n%s\nwant:\n%s", req, got, before)
		}
		_, ferr := mg.Fork(t.Context(), req)
		if perr == nil || ferr == nil || perr.Error() != ferr.Error() {
			t.Errorf("PlanFork(%+v) = %v, Fork = %v; want the same error", req, perr, ferr)
		}
	}
	if d.freezeSeen != 0 {
		t.Errorf("a refused fork froze the source %d times", d.freezeSeen)
	}
}

func TestPlanForkSaysWhatForkDoes(t *testing.T) {
	mg, d := newTestManager(t)
	bootFake(t, mg, "web")
	bootFake(t, mg, "web-2")
	req := ForkRequest{Source: "web", Count: 2, Identity: IdentityOptions{Spec: customize.Spec{Hostname: "node{n}-{parent}"}}}
	before := stateTree(t, mg.Store)
	p, err := mg.PlanFork(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := stateTree(t, mg.Store); got != before {
		t.Errorf("PlanFork changed the state dir:\n%s\nwant:\n%s", got, before)
	}
	if d.freezeSeen != 0 {
		t.Errorf("PlanFork froze the source %d times", d.freezeSeen)
	}
	if !p.DryRun || !p.Changed || !p.SourcePauses || p.Command != "fork" {
		t.Errorf("plan = %+v, want a dry run that changes and pauses", p)
	}
	var got []string
	for _, c := range p.Children {
		got = append(got, c.Name+"="+c.Hostname)
	}
	if want := "web-1=node1-web,web-3=node2-web"; strings.Join(got, ",") != want {
		t.Errorf("children = %v, want %s", got, want)
	}
	// The fake driver has no guest agent, so the children fail their
	// identity; the names they were given are what counts here.
	res, _ := mg.Fork(t.Context(), req)
	var made []string
	for _, c := range res.Children {
		made = append(made, c.Name)
	}
	for _, c := range res.Failed {
		made = append(made, c.Name)
	}
	sort.Strings(made)
	if strings.Join(made, ",") != "web-1,web-3" {
		t.Errorf("fork made children %v, plan said web-1,web-3", made)
	}
}

func TestPlanKeepBootRemoveUnkeep(t *testing.T) {
	mg, _ := newTestManager(t)
	bootFake(t, mg, "web")
	before := stateTree(t, mg.Store)

	if _, err := mg.PlanKeep(t.Context(), KeepRequest{Source: "web", Name: "golden", Pool: MaxPoolSize + 1}); err == nil {
		t.Error("PlanKeep with an oversized pool succeeded, want an error")
	}
	if _, err := mg.PlanKeep(t.Context(), KeepRequest{Source: "web", Name: "web"}); err == nil {
		t.Error("PlanKeep under a machine's name succeeded, want an error")
	}
	p, err := mg.PlanKeep(t.Context(), KeepRequest{Source: "web", Name: "golden"})
	if err != nil || !p.SourcePauses || p.Template != "golden" {
		t.Errorf("PlanKeep = %+v, %v; want a pausing save of golden", p, err)
	}
	if _, err := mg.PlanBoot(t.Context(), BootRequest{Name: "web", Spec: Spec{Kernel: "/nope"}}); err == nil {
		t.Error("PlanBoot with a missing kernel succeeded, want an error")
	}
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.PlanBoot(t.Context(), BootRequest{Name: "web", Spec: Spec{Kernel: kernel, MemoryMiB: 256, CPUs: 1}}); err == nil {
		t.Error("PlanBoot of a taken name succeeded, want an error")
	}
	if p, err := mg.PlanBoot(t.Context(), BootRequest{Name: "db", Spec: Spec{Kernel: kernel, MemoryMiB: 256, CPUs: 1}}); err != nil || p.Machines[0] != "db" {
		t.Errorf("PlanBoot(db) = %+v, %v", p, err)
	}
	p, errs := mg.PlanRemove(t.Context(), []string{"web", "nope"}, false)
	if len(errs) != 2 || errs[0] != nil || errs[1] == nil || strings.Join(p.Machines, ",") != "web" {
		t.Fatalf("PlanRemove = %+v, %v; want web removed and an error for nope", p, errs)
	}
	if _, err := mg.PlanUnkeep(t.Context(), "golden"); err == nil {
		t.Error("PlanUnkeep of a template never kept succeeded, want an error")
	}
	if got := stateTree(t, mg.Store); got != before {
		t.Errorf("plans changed the state dir:\n%s\nwant:\n%s", got, before)
	}
	if rerr := mg.Remove(t.Context(), "nope", false); rerr == nil || rerr.Error() != errs[1].Error() {
		t.Errorf("PlanRemove's error %q, Remove's %v; want the same", errs[1], rerr)
	}
}
