package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
)

// runCLI runs the app in-process as main does and returns its stdout and
// exit code. Commands print to os.Stdout, so it is swapped for a file.
func runCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stdout
	os.Stdout = f
	app := newApp()
	code := exitCode(app.RunContext(t.Context(), normalizeArgs(app, append([]string{"vmfork"}, args...))))
	os.Stdout = saved
	out, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// cliCase is a command (its words) and its arguments.
type cliCase struct{ cmd, rest []string }

func (c cliCase) args(global []string, extra ...string) []string {
	out := append(append([]string{}, global...), c.cmd...)
	return append(append(out, extra...), c.rest...)
}

func tree(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			info, _ := d.Info()
			out = append(out, p+" "+info.ModTime().String())
		}
		return nil
	})
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// A dry run fails exactly as the real run fails on bad input (exit code and
// message), and changes nothing when the input is good.
func TestDryRunMatchesRealRun(t *testing.T) {
	state, mem := t.TempDir(), t.TempDir()
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := vmfork.OpenStore(state, mem)
	if err != nil {
		t.Fatal(err)
	}
	// A stopped machine: its children would boot fresh from its disk, so
	// the real fork would need no QEMU to reach its checks.
	m := &vmfork.Machine{Name: "web", Driver: "qemu", State: vmfork.StateStopped, Paths: store.MachinePaths("web"),
		Spec: vmfork.Spec{Kernel: kernel, MemoryMiB: 256, CPUs: 1}, Created: time.Now().UTC()}
	if err := store.CreateMachine(m); err != nil {
		t.Fatal(err)
	}
	g := []string{"--state-dir", state, "--mem-dir", mem, "-q"}
	// Flags go before positionals: urfave gives each command a help
	// subcommand on its first run, and normalizeArgs leaves the argument
	// order of a command with subcommands alone.
	bad := []cliCase{
		{[]string{"boot"}, []string{"--kernel", "/nonexistent/vmlinuz", "db"}},
		{[]string{"boot"}, []string{"--kernel", kernel, "web"}},
		{[]string{"boot"}, []string{"--kernel", kernel, "Bad_Name"}},
		{[]string{"fork"}, []string{"--count", "2", "nope"}},
		{[]string{"fork"}, []string{"--count", "0", "web"}},
		{[]string{"fork"}, []string{"web", "a", "a"}},
		{[]string{"fork"}, []string{"--count", "2", "--hostname", "x-{bogus}", "web"}},
		{[]string{"template", "save"}, []string{"--pool", "1", "web", "golden"}}, // web is stopped: disk only, no pool
		{[]string{"template", "save"}, []string{"--pool", "1000", "web", "golden"}},
		{[]string{"template", "rm"}, []string{"golden"}},
		{[]string{"template", "pool"}, []string{"golden", "1"}},
		{[]string{"rm"}, []string{"nope"}},
		{[]string{"stop"}, []string{"nope"}},
		{[]string{"checkpoint"}, []string{"web"}}, // web is stopped
		{[]string{"rewind"}, []string{"--to", "nope", "web"}},
		{[]string{"hibernate"}, []string{"web"}},
		{[]string{"resume"}, []string{"web"}},
		{[]string{"explore"}, []string{"--try", "true", "nope"}},
	}
	for _, c := range bad {
		before := tree(t, state)
		_, dry := runCLI(t, c.args(g, "--dry-run")...)
		if got := tree(t, state); got != before {
			t.Errorf("%v --dry-run changed the state dir", c)
		}
		_, real := runCLI(t, c.args(g)...)
		if dry == 0 || dry != real {
			t.Errorf("%v: --dry-run exits %d, the real run %d; want the same failure", c, dry, real)
		}
	}
	before := tree(t, state)
	for _, c := range []cliCase{
		{[]string{"boot"}, []string{"--kernel", kernel, "db"}},
		{[]string{"fork"}, []string{"--count", "2", "--hostname", "node-{n}", "web"}},
		{[]string{"rm"}, []string{"web"}},
		{[]string{"template", "save"}, []string{"web", "golden"}},
	} {
		args := c.cmd
		out, code := runCLI(t, c.args(g, "--dry-run", "--json")...)
		var p vmfork.Plan
		if err := json.Unmarshal([]byte(out), &p); err != nil || code != 0 {
			t.Fatalf("%v --dry-run --json: exit %d, %v: %q", args, code, err, out)
		}
		if !p.DryRun || !p.Changed || len(p.Actions) == 0 || p.Command != strings.Join(args, " ") {
			t.Errorf("%v: plan %+v, want a dry run of %s that would change something", args, p, args[0])
		}
		if args[0] == "fork" {
			if len(p.Children) != 2 || p.Children[1].Name != "web-2" || p.Children[1].Hostname != "node-2" || p.SourcePauses {
				t.Errorf("fork plan children %+v (pauses %v), want web-1, web-2 as node-1, node-2 and no pause", p.Children, p.SourcePauses)
			}
		}
	}
	if got := tree(t, state); got != before {
		t.Errorf("dry runs changed the state dir:\n%s\nwant:\n%s", got, before)
	}
}

// A dry run's JSON is part of the contract with the Ansible modules (check
// mode): this golden file changes only by adding keys.
func TestPlanJSONGolden(t *testing.T) {
	p := vmfork.Plan{
		DryRun: true, Command: "fork", Changed: true, Source: "web", SourcePauses: true,
		Actions: []string{
			`pause running machine "web" for a fraction of a second and freeze it into a new template; it carries on`,
			"start 1 children from that instant",
		},
		Children: []vmfork.PlannedChild{{Name: "web-1", Index: 1, Hostname: "node1"}},
	}
	got, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "plan-fork.json")
	if *update {
		if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/vmfork -update)", err)
	}
	if string(got)+"\n" != string(want) {
		t.Errorf("plan JSON changed (rerun with -update and review the diff):\ngot:\n%s\nwant:\n%s", got, want)
	}
}
