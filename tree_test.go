package vmfork

import (
	"strings"
	"testing"
	"time"
)

const mb = 1 << 20

// family is base → base.1 → {kid, kid2}, kid → kid.1 → grand, with sizes
// that the fakes below report.
func family(now time.Time) treeInput {
	at := func(min int) time.Time { return now.Add(-time.Duration(min) * time.Minute) }
	ms := []*Machine{
		{Name: "base", State: StateRunning, Created: at(10), Spec: Spec{Disk: "/base.qcow2"}, Paths: Paths{Disk: "/m/base"}},
		{Name: "kid", State: StateRunning, Created: at(8), Parent: "base", Template: "base.1", Expires: now.Add(90 * time.Second),
			Spec: Spec{Disk: "/base.qcow2"}, Paths: Paths{Disk: "/m/kid"}},
		{Name: "kid2", State: StateRunning, Created: at(7), Parent: "base", Template: "base.1", Spec: Spec{Disk: "/base.qcow2"}, Paths: Paths{Disk: "/m/kid2"}},
		{Name: "grand", State: StateRunning, Created: at(5), Parent: "kid", Template: "kid.1", Spec: Spec{Disk: "/base.qcow2"}, Paths: Paths{Disk: "/m/grand"}},
	}
	ts := []*Template{
		{ID: "base.1", Source: "base", Created: at(9), HasMemory: true, Paths: TemplatePaths{RAM: "/r/base.1", Disk: "/t/base.1"}},
		{ID: "kid.1", Source: "kid", SourceParent: "base", SourceTemplate: "base.1", Created: at(6), HasMemory: true,
			Paths: TemplatePaths{RAM: "/r/kid.1", Disk: "/t/kid.1"}},
	}
	sizes := map[string]int64{"/m/base": 1 * mb, "/m/kid": 2 * mb, "/m/kid2": 1 * mb, "/m/grand": 1 * mb,
		"/r/base.1": 100 * mb, "/t/base.1": 10 * mb, "/r/kid.1": 50 * mb, "/t/kid.1": 5 * mb}
	ram := map[string]int64{"base": 200 * mb, "kid": 20 * mb, "kid2": 10 * mb, "grand": 5 * mb}
	return treeInput{
		machines: ms, templates: ts, now: now,
		ram:  func(m *Machine) int64 { return ram[m.Name] },
		disk: func(p string) int64 { return sizes[p] },
	}
}

func renderTree(t *testing.T, tr *Tree) string {
	t.Helper()
	var b strings.Builder
	if err := tr.Render(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestTreeShowsAFamily(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	tr := buildTree(family(now))
	want := `base  running  age 10m0s  ram 200.0M  disk 1.0M
└─ base.1  template  age 9m0s  ram 100.0M  disk 10.0M
   ├─ kid  running  age 8m0s  ttl 1m30s  ram 20.0M  disk 2.0M
   │  └─ kid.1  template  age 6m0s  ram 50.0M  disk 5.0M
   │     └─ grand  running  age 5m0s  ram 5.0M  disk 1.0M
   └─ kid2  running  age 7m0s  ram 10.0M  disk 1.0M
held 405.0M on their own; sharing saves 110.0M
`
	if got := renderTree(t, tr); got != want {
		t.Errorf("tree:\n%s\nwant:\n%s", got, want)
	}
}

// After the middle machine goes, its template (which its child still
// maps) keeps its place under a removed node.
func TestTreeAfterTheMiddleMachineWasRemoved(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	in := family(now)
	in.machines = append(in.machines[:1], in.machines[2:]...) // kid removed
	want := `base  running  age 10m0s  ram 200.0M  disk 1.0M
└─ base.1  template  age 9m0s  ram 100.0M  disk 10.0M
   ├─ kid  removed
   │  └─ kid.1  template  age 6m0s  ram 50.0M  disk 5.0M
   │     └─ grand  running  age 5m0s  ram 5.0M  disk 1.0M
   └─ kid2  running  age 7m0s  ram 10.0M  disk 1.0M
held 383.0M on their own; sharing saves 0.0M
`
	if got := renderTree(t, buildTree(in)); got != want {
		t.Errorf("tree:\n%s\nwant:\n%s", got, want)
	}
	// With base.1 gone too, the removed node hangs under base itself.
	in.templates = in.templates[1:]
	in.machines = in.machines[:1]
	in.machines = append(in.machines, &Machine{Name: "grand", State: StateRunning, Created: now, Parent: "kid", Template: "kid.1"})
	got := renderTree(t, buildTree(in))
	if !strings.HasPrefix(got, "base  running") || !strings.Contains(got, "└─ kid  removed\n   └─ kid.1  template") {
		t.Errorf("tree without base.1:\n%s\nwant kid (removed) under base", got)
	}
}

func TestTreeOfOneFamily(t *testing.T) {
	mg, _ := newTestManager(t)
	bootFake(t, mg, "a")
	bootFake(t, mg, "b")
	tr, err := mg.Tree(t.Context(), "b")
	if err != nil || len(tr.Roots) != 1 || tr.Roots[0].Name != "b" {
		t.Fatalf("Tree(b) = %+v, %v; want b's family alone", tr, err)
	}
	if _, err := mg.Tree(t.Context(), "nope"); err == nil {
		t.Errorf("Tree(nope): no error")
	}
	tr, err = mg.Tree(t.Context(), "")
	if err != nil || len(tr.Roots) != 2 {
		t.Errorf("Tree() = %+v, %v; want two roots", tr, err)
	}
}
