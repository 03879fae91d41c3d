package vmfork

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every machine and template made from a root shares its family; another
// root is another family.
func TestFamilies(t *testing.T) {
	mg := parityState(t) // web, db, sleepy, other; golden, disk; web-cp1, other-cp1
	ctx := t.Context()
	load := func(name string) string {
		t.Helper()
		m, err := mg.Store.LoadMachine(name)
		if err != nil {
			t.Fatal(err)
		}
		return m.Family
	}
	web := load("web")
	if web == "" || web == load("db") || web == load("other") {
		t.Fatalf("roots' families: web %q, db %q, other %q; want distinct ids", web, load("db"), load("other"))
	}
	for _, req := range []ForkRequest{
		{Source: "web", Names: []string{"a"}},    // a live fork
		{Source: "golden", Names: []string{"b"}}, // a kept template of web
		{Source: "a", Names: []string{"c"}},      // a fork of a fork
	} {
		req.Identity = quietChain
		if _, err := mg.Fork(ctx, req); err != nil {
			t.Fatal(err)
		}
		if got := load(req.Names[0]); got != web {
			t.Errorf("%s (from %s): family %q, want web's %q", req.Names[0], req.Source, got, web)
		}
	}
	if _, err := mg.Rewind(ctx, RewindRequest{Machine: "a", To: "web-cp1", Identity: quietChain, Force: true}); err != nil {
		t.Fatal(err)
	}
	if got := load("a"); got != web {
		t.Errorf("after a rewind: family %q, want %q", got, web)
	}
	if _, err := mg.Fork(ctx, ForkRequest{Source: "sleepy", Names: []string{"s"}, Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	if got, want := load("s"), load("sleepy"); got != want {
		t.Errorf("child of a hibernated machine: family %q, want %q", got, want)
	}
	sleepy := load("sleepy")
	if _, err := mg.Resume(ctx, ResumeRequest{Machine: "sleepy", Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	if got := load("sleepy"); got != sleepy {
		t.Errorf("after a resume: family %q, want %q", got, sleepy)
	}
	tpls, _ := mg.Store.ListTemplates()
	seen := 0
	for _, tp := range tpls {
		if (tp.Name == "golden" || tp.Name == "web-cp1") && tp.Family != web {
			t.Errorf("%s's family %q, want web's %q", tp.Name, tp.Family, web)
		}
		if tp.Name == "golden" || tp.Name == "web-cp1" {
			seen++
		}
	}
	if seen != 2 {
		t.Errorf("found %d of the templates golden and web-cp1", seen)
	}
}

// A machine whose own directory is too deep for a unix socket's address
// gets its ledger socket in LedgerRunDir, the same path every time, made
// ready (directory made, a stale socket gone) by PrepareLedgerSocket.
func TestLedgerSocketOfADeepMachine(t *testing.T) {
	run := t.TempDir()
	old := LedgerRunDir
	LedgerRunDir = run
	t.Cleanup(func() { LedgerRunDir = old })

	short := &Machine{Name: "web", Spec: Spec{LedgerPort: true}, Paths: Paths{Dir: "/var/lib/vmfork/machines/web"}}
	if got := short.LedgerSocket(); got != "/var/lib/vmfork/machines/web/ledger.sock" {
		t.Errorf("short dir: socket %q, want the machine's own", got)
	}
	deep := &Machine{Name: "web", Spec: Spec{LedgerPort: true}, Paths: Paths{Dir: "/var/tmp/" + strings.Repeat("d", 100) + "/machines/web"}}
	got := deep.LedgerSocket()
	if filepath.Dir(got) != run || len(got) > maxSocketPath || got != deep.LedgerSocket() {
		t.Fatalf("deep dir: socket %q, want a stable short path in %s", got, run)
	}
	other := &Machine{Name: "web2", Spec: Spec{LedgerPort: true}, Paths: Paths{Dir: deep.Paths.Dir + "2"}}
	if other.LedgerSocket() == got {
		t.Errorf("two deep machines share socket %q", got)
	}
	if err := os.WriteFile(got, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := deep.PrepareLedgerSocket(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(got); !os.IsNotExist(err) {
		t.Errorf("stale socket %s still there: %v", got, err)
	}
	if (&Machine{Name: "old", Paths: deep.Paths}).LedgerSocket() != "" {
		t.Errorf("a machine without the port has a socket")
	}
}

// An ordinary user's deep machines put their ledger sockets in a directory
// of its own (it may not write in /run), and one that others may write in
// is refused in one line.
func TestLedgerRunDirPerUser(t *testing.T) {
	if got := ledgerRunDir(0); got != "/run/vmfork/ledger" {
		t.Errorf("root's: %s", got)
	}
	if got := ledgerRunDir(1000); got != "/dev/shm/vmfork-1000-ledger" {
		t.Errorf("uid 1000's: %s", got)
	}
	run := filepath.Join(t.TempDir(), "ledger")
	if err := os.Mkdir(run, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(run, 0o777)
	old := LedgerRunDir
	LedgerRunDir = run
	t.Cleanup(func() { LedgerRunDir = old })
	deep := &Machine{Name: "web", Spec: Spec{LedgerPort: true}, Paths: Paths{Dir: "/var/tmp/" + strings.Repeat("d", 100) + "/machines/web"}}
	err := deep.PrepareLedgerSocket()
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), run) || strings.Contains(err.Error(), "\n") {
		t.Errorf("a directory anyone may write in: %v; want one line refusing it", err)
	}
}
