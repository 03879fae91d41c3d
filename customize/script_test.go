package customize

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Shell functions of the steps' scripts, run by real shells on the host:
// dash (Debian's /bin/sh) and busybox's ash (what the test guest runs),
// when they are there.
func hostShells(t *testing.T) [][]string {
	t.Helper()
	var shells [][]string
	if p, err := exec.LookPath("dash"); err == nil {
		shells = append(shells, []string{p})
	}
	if p, err := exec.LookPath("busybox"); err == nil {
		shells = append(shells, []string{p, "sh"})
	}
	if len(shells) == 0 {
		t.Skip("no dash or busybox on this host")
	}
	return shells
}

func runShell(t *testing.T, sh []string, script string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	argv := append(append(sh[1:len(sh):len(sh)], "-c", script, "sh"), args...)
	cmd := exec.Command(sh[0], argv...)
	cmd.Env = []string{guestPath, "LC_ALL=C"}
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func TestReplaceHostScript(t *testing.T) {
	const hosts = "127.0.0.1\tlocalhost\n" +
		"127.0.1.1\tweb\tweb.lab\n" +
		"\n" +
		"# web is the old name\n" +
		"10.0.0.9  web-db  web  *\n" +
		"web\tnot-a-name-field\n" +
		"::1     localhost ip6-localhost"
	// What the awk program gives: changed lines joined by single spaces,
	// the rest as they were, a newline after the last line.
	const want = "127.0.0.1\tlocalhost\n" +
		"127.0.1.1 web-2 web.lab\n" +
		"\n" +
		"# web-2 is the old name\n" +
		"10.0.0.9 web-db web-2 *\n" +
		"web\tnot-a-name-field\n" +
		"::1     localhost ip6-localhost\n"
	awk := func(t *testing.T, in string) string {
		cmd := exec.Command("awk", "-v", "old=web", "-v", "new=web-2", `{ for (i = 2; i <= NF; i++) if ($i == old) $i = new; print }`)
		cmd.Stdin = strings.NewReader(in)
		out, err := cmd.Output()
		if err != nil {
			t.Skipf("awk: %v", err)
		}
		return string(out)
	}
	// The awk program that replace_host stands for agrees.
	if got := awk(t, hosts); got != want {
		t.Errorf("awk gives\n%s\nwant\n%s", got, want)
	}
	var long strings.Builder
	for i := range 600 {
		fmt.Fprintf(&long, "10.0.%d.%d\thost-%d web\n", i/250, i%250, i)
	}
	for _, sh := range hostShells(t) {
		// A file too long for the shell loop goes through awk.
		file := filepath.Join(t.TempDir(), "hosts")
		if err := os.WriteFile(file, []byte(long.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, stderr, code := runShell(t, sh, replaceHostFunc+"\nreplace_host \"$@\"", file, "web", "web-2"); code != 0 {
			t.Fatalf("%s: exit %d: %s", sh[0], code, stderr)
		}
		if b, _ := os.ReadFile(file); string(b) != awk(t, long.String()) {
			t.Errorf("%s: a long file was not edited as awk does", sh[0])
		}

		file = filepath.Join(t.TempDir(), "hosts")
		if err := os.WriteFile(file, []byte(hosts), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, stderr, code := runShell(t, sh, replaceHostFunc+"\nreplace_host \"$@\"", file, "web", "web-2"); code != 0 {
			t.Fatalf("%s: exit %d: %s", sh[0], code, stderr)
		}
		if b, _ := os.ReadFile(file); string(b) != want {
			t.Errorf("%s: /etc/hosts became\n%s\nwant\n%s", sh[0], b, want)
		}
		// A file that does not name the old hostname is not written.
		before := time.Now().Add(-time.Hour)
		if err := os.Chtimes(file, before, before); err != nil {
			t.Fatal(err)
		}
		if _, stderr, code := runShell(t, sh, replaceHostFunc+"\nreplace_host \"$@\"", file, "db", "db-2"); code != 0 {
			t.Fatalf("%s: exit %d: %s", sh[0], code, stderr)
		}
		if st, _ := os.Stat(file); !st.ModTime().Equal(before) {
			t.Errorf("%s: a file without the old name was rewritten", sh[0])
		}
	}
}
