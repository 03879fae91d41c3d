package vmfork

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

func newExploreManager(t *testing.T) (*Manager, *agentDriver) {
	t.Helper()
	mg, _ := newTestManager(t)
	d := newAgentDriver()
	mg.Driver = d
	countStarts(mg)
	bootFake(t, mg, "src")
	return mg, d
}

func exploreRecords(t *testing.T, mg *Manager) int {
	t.Helper()
	rs, err := mg.Store.listExplores()
	if err != nil {
		t.Fatal(err)
	}
	return len(rs)
}

// One try fails, one hangs past its timeout, one succeeds: the one that
// succeeded is kept with its changes, and the other branches are gone.
func TestExploreKeepsTheWinnerOnly(t *testing.T) {
	mg, d := newExploreManager(t)
	res, err := mg.Explore(t.Context(), ExploreRequest{
		Source:     "src",
		Tries:      []string{"echo no; exit 3", "sleep", "write /w/out done; echo yes"},
		TryTimeout: 300 * time.Millisecond,
		Watch:      []string{"/w"},
		Identity:   fakeGuestIdentity,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Winner != "src-try-3" || res.WinnerTry != 3 {
		t.Fatalf("winner %q (try %d), want src-try-3 (try 3)", res.Winner, res.WinnerTry)
	}
	if got := machineNames(t, mg.Store); got != "src,src-try-3" {
		t.Errorf("machines = %s, want src,src-try-3", got)
	}
	if !slices.Equal(res.Removed, []string{"src-try-1", "src-try-2"}) || !slices.Equal(res.Kept, []string{"src-try-3"}) {
		t.Errorf("removed %v, kept %v; want src-try-1,2 removed and src-try-3 kept", res.Removed, res.Kept)
	}
	t1, t2, t3 := res.Tries[0], res.Tries[1], res.Tries[2]
	if t1.ExitCode != 3 || t1.Stdout != "no\n" || t1.Kept {
		t.Errorf("failing try = %+v", t1)
	}
	if !t2.TimedOut || t2.DurationMS < 300 {
		t.Errorf("hanging try = %+v, want timed out after 300 ms", t2)
	}
	if t3.ExitCode != 0 || !t3.Kept || !slices.Equal(t3.Changed, []string{"A /w/out"}) || t3.ChangedCount != 1 {
		t.Errorf("winning try = %+v, want exit 0, kept, A /w/out", t3)
	}
	if d.running["src-try-1"] || d.running["src-try-2"] {
		t.Errorf("a loser's process still runs")
	}
	if n := exploreRecords(t, mg); n != 0 {
		t.Errorf("%d explore records left", n)
	}
}

func TestExploreKeepAsForksTheWinnerOnce(t *testing.T) {
	mg, d := newExploreManager(t)
	res, err := mg.Explore(t.Context(), ExploreRequest{
		Source: "src", Tries: []string{"exit 1", "write /w/a 1"}, KeepAs: "best", Identity: fakeGuestIdentity,
		TTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Winner != "best" || !slices.Equal(res.Kept, []string{"best"}) {
		t.Errorf("winner %q, kept %v; want best", res.Winner, res.Kept)
	}
	if got := machineNames(t, mg.Store); got != "best,src" {
		t.Errorf("machines = %s, want best,src", got)
	}
	if f := d.guest("best").files["/w/a"]; f != "1" {
		t.Errorf("best's /w/a = %q, want the winner's change", f)
	}
	if m, _ := mg.Store.LoadMachine("best"); m == nil || m.Expires.IsZero() {
		t.Errorf("best has no deadline; want the explore's TTL")
	}
}

func TestExploreWithoutAWinnerRemovesEveryBranch(t *testing.T) {
	mg, _ := newExploreManager(t)
	res, err := mg.Explore(t.Context(), ExploreRequest{Source: "src", Tries: []string{"exit 1", "nosuchcommand"}, Identity: fakeGuestIdentity})
	if !errors.Is(err, ErrNoWinner) || res == nil || len(res.Tries) != 2 {
		t.Fatalf("Explore = %+v, %v; want ErrNoWinner with both tries", res, err)
	}
	if res.Tries[1].ExitCode != 127 || !strings.Contains(res.Tries[1].Stderr, "not found") {
		t.Errorf("second try = %+v, want exit 127 and its stderr", res.Tries[1])
	}
	if got := machineNames(t, mg.Store); got != "src" {
		t.Errorf("machines = %s, want src", got)
	}
}

func TestExploreKeepAllAndScore(t *testing.T) {
	mg, _ := newExploreManager(t)
	// The score reads what the try left: 5, 9 and nothing (no number).
	res, err := mg.Explore(t.Context(), ExploreRequest{
		Source: "src", Tries: []string{"write /s 5", "write /s 9", "exit 0"},
		Score: "cat /s", KeepAll: true, Identity: fakeGuestIdentity,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.WinnerTry != 2 {
		t.Errorf("winner try %d, want 2 (the highest score)", res.WinnerTry)
	}
	if got := machineNames(t, mg.Store); got != "src,src-try-1,src-try-2,src-try-3" {
		t.Errorf("machines = %s, want every branch kept", got)
	}
	if s := res.Tries[0].Score; s == nil || *s != 5 || res.Tries[2].Score != nil || !strings.HasPrefix(res.Tries[2].Error, "score: ") {
		t.Errorf("tries = %+v, want try 1 scored 5 and try 3 unscored with a score error", res.Tries)
	}
}

func TestExploreRefusesBadInputBeforeForking(t *testing.T) {
	mg, d := newExploreManager(t)
	bootFake(t, mg, "taken")
	cases := []ExploreRequest{
		{Source: "src"},
		{Source: "src", Tries: []string{"a", "b", "c"}, MaxChildren: 2},
		{Source: "src", Tries: []string{"  "}},
		{Source: "src", Tries: []string{"a"}, Watch: []string{"relative"}},
		{Source: "src", Tries: []string{"a"}, KeepAs: "taken"},
		{Source: "src", Tries: []string{"a"}, KeepAs: "Bad_Name"},
		{Source: "src", Tries: []string{"a"}, TTL: -time.Second},
		{Source: "nope", Tries: []string{"a"}},
	}
	for _, c := range cases {
		if _, err := mg.Explore(t.Context(), c); err == nil {
			t.Errorf("Explore(%+v) succeeded, want an error", c)
		}
	}
	if d.freezeSeen != 0 {
		t.Errorf("refused explores froze the source %d times", d.freezeSeen)
	}
	if got := machineNames(t, mg.Store); got != "src,taken" {
		t.Errorf("machines = %s, want src,taken", got)
	}
	if n := exploreRecords(t, mg); n != 0 {
		t.Errorf("%d explore records left by refused explores", n)
	}
}

// A branch that does not come up loses; the others still run.
func TestExploreBranchThatFailsToStartLoses(t *testing.T) {
	mg, d := newExploreManager(t)
	d.startFail["src-try-1"] = true
	res, err := mg.Explore(t.Context(), ExploreRequest{Source: "src", Tries: []string{"exit 0", "exit 0"}, Identity: fakeGuestIdentity})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Tries[0].Error, "branch did not come up") || res.Winner != "src-try-2" {
		t.Errorf("tries %+v, winner %q; want try 1 failed and src-try-2 kept", res.Tries, res.Winner)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirMachines)); n != 2 {
		t.Errorf("%d machine directories, want src and the winner", n)
	}
}

func score(v float64) *float64 { return &v }

func TestPickWinner(t *testing.T) {
	cases := []struct {
		name   string
		tries  []TryResult
		scored bool
		want   int
	}{
		{"fastest exit 0", []TryResult{{ExitCode: 0, DurationMS: 50}, {ExitCode: 1, DurationMS: 1}, {ExitCode: 0, DurationMS: 20}}, false, 2},
		{"timeout and error never win", []TryResult{{ExitCode: 0, TimedOut: true, DurationMS: 1}, {ExitCode: 0, Error: "x", DurationMS: 1}, {ExitCode: 0, DurationMS: 9}}, false, 2},
		{"none", []TryResult{{ExitCode: 2}, {TimedOut: true}}, false, -1},
		{"highest score", []TryResult{{Score: score(1), DurationMS: 1}, {Score: score(7), ExitCode: 1, DurationMS: 9}, {}}, true, 1},
		{"tie: exit 0, then fastest", []TryResult{{Score: score(5), ExitCode: 1, DurationMS: 1}, {Score: score(5), DurationMS: 8}, {Score: score(5), DurationMS: 3}}, true, 2},
		{"unscored never wins", []TryResult{{DurationMS: 1}}, true, -1},
	}
	for _, c := range cases {
		if got := pickWinner(c.tries, c.scored); got != c.want {
			t.Errorf("%s: pickWinner = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestParseScore(t *testing.T) {
	cases := []struct {
		st   qmp.ExecStatus
		want float64
		ok   bool
	}{
		{qmp.ExecStatus{Stdout: []byte("building\n42.5\n\n")}, 42.5, true},
		{qmp.ExecStatus{Stdout: []byte("-3")}, -3, true},
		{qmp.ExecStatus{Stdout: []byte("many")}, 0, false},
		{qmp.ExecStatus{Stdout: []byte("1"), ExitCode: 1}, 0, false},
	}
	for _, c := range cases {
		got, err := parseScore(c.st)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseScore(%q) = %v, %v; want %v (ok %v)", c.st.Stdout, got, err, c.want, c.ok)
		}
	}
}

func TestDiffFiles(t *testing.T) {
	before := parseSnapshot([]byte("aaa  /w/same\nbbb  /w/changed\nccc  /w/deleted\n"))
	after := parseSnapshot([]byte("aaa  /w/same\nbbx  /w/changed\nddd  /w/added file\n"))
	got := diffFiles(before, after)
	want := []string{"A /w/added file", "M /w/changed", "D /w/deleted"}
	if !slices.Equal(got, want) {
		t.Errorf("diffFiles = %q, want %q", got, want)
	}
}

func TestTailKeepsTheEnd(t *testing.T) {
	if got := tail([]byte("0123456789"), 4); got != "6789" {
		t.Errorf("tail = %q, want 6789", got)
	}
	if got := tail([]byte("ab\xffc"), 10); got != "abc" {
		t.Errorf("tail of invalid UTF-8 = %q, want abc", got)
	}
}

func TestProcStartNamesThisProcess(t *testing.T) {
	a, err := procStart(os.Getpid())
	if err != nil || a == 0 {
		t.Fatalf("procStart(self) = %d, %v", a, err)
	}
	if _, err := procStart(1 << 30); err == nil {
		t.Errorf("procStart of no process: no error")
	}
}

// The next command's repair (any command that calls Recover) removes the
// branches of an explore that died, as the reaper would.
func TestNextCommandRemovesBranchesOfADeadExplore(t *testing.T) {
	mg, _ := newTestManager(t)
	bootFake(t, mg, "b-1")
	bootFake(t, mg, "keep")
	rec, err := mg.Store.newExplore("src", []string{"b-1"})
	if err != nil {
		t.Fatal(err)
	}
	rec.PID = 1 << 30
	if err := rec.save(); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.List(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := machineNames(t, mg.Store); got != "keep" {
		t.Errorf("machines after the next command = %s, want keep", got)
	}
	if n := exploreRecords(t, mg); n != 0 {
		t.Errorf("%d explore records left", n)
	}
}
