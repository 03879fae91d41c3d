package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/ledger"
)

// vmfork ledger NAME lists NAME's family's records (table, JSON), and
// --release KEY releases one (--dry-run changes nothing); an unknown
// machine or an unclaimed key is exit 4, bad usage exit 2. No server
// runs: the client reads the ledger itself.
func TestLedgerCommand(t *testing.T) {
	state, mem := t.TempDir(), t.TempDir()
	store, err := vmfork.OpenStore(state, mem)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ name, family string }{{"web", "fam1"}, {"web-1", "fam1"}, {"other", "fam2"}} {
		if err := store.CreateMachine(&vmfork.Machine{Name: m.name, State: vmfork.StateStopped, Family: m.family, Paths: store.MachinePaths(m.name)}); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := ledger.OpenStore(filepath.Join(state, ledgerDirName), ledger.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ family, machine, key string }{{"fam1", "web-1", "pay-42"}, {"fam1", "web", "mail-7"}, {"fam2", "other", "pay-42"}} {
		if _, err := ls.Claim(c.family, c.machine, c.key); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ls.Done("fam1", "web", "mail-7", "msg-id-1"); err != nil {
		t.Fatal(err)
	}
	ls.Close()
	g := []string{"--state-dir", state, "--mem-dir", mem}
	// A fresh copy of the command per run: urfave keeps state in a
	// command between runs in one process (a second run's flags after
	// "--" misparse), which main never sees.
	orig := ledgerCommand
	defer func() { ledgerCommand = orig }()
	cli := func(args ...string) (string, int) {
		t.Helper()
		c := *orig
		ledgerCommand = &c
		return runCLI(t, append(g, args...)...)
	}

	out, code := cli("ledger", "web")
	if code != 0 || !strings.Contains(out, "KEY") || !strings.Contains(out, "pay-42") || !strings.Contains(out, "web-1") ||
		!strings.Contains(out, "msg-id-1") || strings.Contains(out, "other") {
		t.Errorf("ledger web: exit %d\n%s", code, out)
	}
	out, code = cli("ledger", "web-1", "--json")
	var recs []ledger.Record
	if err := json.Unmarshal([]byte(out), &recs); code != 0 || err != nil || len(recs) != 2 || recs[0].Key != "mail-7" || recs[0].State != ledger.Done {
		t.Errorf("ledger web-1 --json: exit %d, %v: %s", code, err, out)
	}
	if _, code := cli("ledger", "nosuch"); code != exitNotFound {
		t.Errorf("ledger nosuch: exit %d, want %d", code, exitNotFound)
	}
	for _, bad := range [][]string{{"ledger"}, {"ledger", "a", "b"}, {"ledger", "web", "--release", "has space"}, {"ledger", "web", "--dry-run"}} {
		if _, code := cli(bad...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", bad, code, exitUsage)
		}
	}
	out, code = cli("ledger", "web", "--release", "pay-42", "--dry-run")
	if code != 0 || !strings.Contains(out, "would release pay-42, claimed by web-1") {
		t.Errorf("--dry-run: exit %d\n%s", code, out)
	}
	out, code = cli("ledger", "web", "--release", "pay-42", "--json")
	var r ledger.Record
	if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil || r.State != ledger.Released || r.ReleasedBy != ledger.ByOperator {
		t.Errorf("--release: exit %d, %v: %s", code, err, out)
	}
	if _, code := cli("ledger", "web", "--release", "pay-42"); code != exitNotFound {
		t.Errorf("second --release: exit %d, want %d", code, exitNotFound)
	}
	if _, code := cli("ledger", "web", "--release", "nokey", "--dry-run"); code != exitNotFound {
		t.Errorf("--dry-run of an unclaimed key: exit %d, want %d", code, exitNotFound)
	}
	// The other family's claim of the same key is untouched.
	out, _ = cli("ledger", "other", "--json")
	if !strings.Contains(out, `"state": "claimed"`) {
		t.Errorf("other family after the release: %s", out)
	}
}
