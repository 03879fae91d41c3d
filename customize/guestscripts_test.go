package customize

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Every .sh file under scripts/ is embedded and used by a step, and opens
// with its contract (guestscripts.go).
func TestGuestScripts(t *testing.T) {
	var onDisk []string
	err := filepath.WalkDir("scripts", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".sh") {
			onDisk = append(onDisk, filepath.ToSlash(path))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(onDisk) == 0 {
		t.Fatal("no scripts/*.sh: a test that finds nothing to check could not fail")
	}
	for _, path := range onDisk {
		if _, err := fs.Stat(scriptFiles, path); err != nil {
			t.Errorf("%s is not embedded (go:embed scripts/*.sh takes the folder's top level only)", path)
			continue
		}
		name := strings.TrimPrefix(path, "scripts/")
		if !scriptsUsed[name] {
			t.Errorf("%s is embedded but no guestScript call reads it: use it or remove it", path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkContract(name, string(b)); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
	embedded, err := fs.Glob(scriptFiles, "scripts/*")
	if err != nil {
		t.Fatal(err)
	}
	if len(embedded) != len(onDisk) {
		t.Errorf("%d files embedded, %d .sh files under scripts/", len(embedded), len(onDisk))
	}
}

// checkContract checks the comment block a guest script starts with: its
// name and purpose on the first line, then each part of the contract, and
// a reason beside every shellcheck directive.
func checkContract(name, file string) error {
	head, _, ok := strings.Cut(file, "\n\n")
	if !ok {
		return fmt.Errorf("no empty line ends the contract")
	}
	lines := strings.Split(head, "\n")
	if !strings.HasPrefix(lines[0], "# "+name+": ") {
		return fmt.Errorf("first line %q, want %q and what the script is for", lines[0], "# "+name+": ")
	}
	for _, field := range []string{"Runs:", "Inputs:", "Outputs:", "Must not:"} {
		found := false
		for _, l := range lines {
			if rest, ok := strings.CutPrefix(l, "# "+field); ok && strings.TrimSpace(rest) != "" {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("the contract has no %q line", field)
		}
	}
	for _, l := range lines {
		if d, ok := strings.CutPrefix(l, "# shellcheck disable="); ok && !strings.Contains(d, " # ") {
			return fmt.Errorf("%q gives no reason (# shellcheck disable=SCnnnn # why)", l)
		}
	}
	return nil
}

// The scripts hold literally what the Go side must agree with: the batch's
// frames and input variable, the SSH input's mark, the network parts'
// state file.
func TestGuestScriptsAgreeWithGo(t *testing.T) {
	octal := func(s string) string {
		var b strings.Builder
		for _, c := range []byte(s) {
			if c < ' ' {
				fmt.Fprintf(&b, `\%03o`, c)
			} else {
				b.WriteByte(c)
			}
		}
		return b.String()
	}
	for _, c := range []struct{ script, name, want string }{
		{batchHead, "batch-head.sh", "vmfork_input=${" + inputVar + "-}\nunset " + inputVar + "\n"},
		{batchHead, "batch-head.sh", "printf '" + octal(batchMark) + " part %s\\n' \"$vmfork_n\"\n"},
		{batchHead, "batch-head.sh", "printf '\\n" + octal(batchMark) + " end %s %s %s\\n'"},
		{batchHead, "batch-head.sh", "case $vmfork_rc in 0 | " + strconv.Itoa(exitNothingToDo) + ") return 0 ;; esac"},
		{sshScript, "ssh-keys.sh", "m='" + keyMark + "'"},
		{secretsScript, "secrets.sh", "m='" + keyMark + "'"},
		{rotateScript, "secret-files-rotate.sh", "m='" + keyMark + "'"},
		{netDownScript, "network-down.sh", "state=$R/run/.vmfork-network\n"},
		{netUpScript, "network-up.sh", `[ -r "$R/run/.vmfork-network" ] && . "$R/run/.vmfork-network"`},
	} {
		if !strings.Contains(c.script, c.want) {
			t.Errorf("%s has no %q", c.name, c.want)
		}
	}
}

// No guest script of more than a few lines stays in a Go string: it goes to
// scripts/ with its contract.
func TestNoScriptsInGoStrings(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err == nil && strings.Count(strings.TrimSuffix(s, "\n"), "\n") >= 10 {
				t.Errorf("%s: a string of %d lines: a guest script belongs in scripts/", fset.Position(lit.Pos()), strings.Count(s, "\n")+1)
			}
			return true
		})
	}
}
