package vmfork

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ShellQuote's output, read back by a real sh, is the word it was given:
// fork --to hands the remote fork's arguments to the other host's shell.
func TestShellQuote(t *testing.T) {
	for _, w := range []string{"kid", "--hostname={name}-b", "", "a b", "it's", `"$(touch /tmp/x)"`, "--step-timeout=vmfork.clock=5s", "*", "a\nb"} {
		out, err := exec.Command("sh", "-c", "printf %s "+ShellQuote(w)).Output()
		if err != nil {
			t.Fatalf("sh on %q: %v", ShellQuote(w), err)
		}
		if string(out) != w {
			t.Errorf("ShellQuote(%q) = %s, read back as %q", w, ShellQuote(w), out)
		}
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

// The other host's end of a fork --to keeps its children only when the
// commit line comes: a session that ends first (EOF), or a result that
// cannot be sent (the link is gone), removes them, and the pushed template
// is given up in every case.
func TestServeForkKeepsChildrenOnlyOnCommit(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		out  io.Writer
		keep bool
	}{
		{"commit", forkCommit + "\n", &bytes.Buffer{}, true},
		{"session ended", "", &bytes.Buffer{}, false},
		{"something else", "abort\n", &bytes.Buffer{}, false},
		{"result not sent", forkCommit + "\n", failingWriter{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			mg, _ := newTestManager(t)
			bootFake(t, mg, "src")
			if _, err := mg.Keep(t.Context(), KeepRequest{Source: "src", Name: "fork-to-0123456789ab"}); err != nil {
				t.Fatal(err)
			}
			res, err := mg.ServeFork(t.Context(), ForkRequest{Source: "fork-to-0123456789ab", Names: []string{"kid"}, Identity: quietChain}, "",
				strings.NewReader(c.in), c.out, time.Minute)
			if c.keep != (err == nil) {
				t.Fatalf("ServeFork = %+v, %v; want kept %v", res, err, c.keep)
			}
			want := "src"
			if c.keep {
				want = "kid,src"
				var got ForkResult
				if jerr := json.Unmarshal(c.out.(*bytes.Buffer).Bytes(), &got); jerr != nil || len(got.Children) != 1 || got.Children[0].Name != "kid" {
					t.Errorf("the result line = %q (%v), want child kid", c.out.(*bytes.Buffer).String(), jerr)
				}
			}
			if got := machineNames(t, mg.Store); got != want {
				t.Errorf("machines = %s, want %s", got, want)
			}
			if _, err := mg.Store.FindKept("fork-to-0123456789ab"); !errors.Is(err, ErrNotFound) {
				t.Errorf("the pushed template is still kept: %v", err)
			}
		})
	}
}

// The client end of a fork --to: the remote command line has the flags
// before the template and the names, the result is read, and the commit is
// sent only after it; a far end that ends without a result is a failure.
func TestRemoteForkCommitsAfterTheResult(t *testing.T) {
	dir := t.TempDir()
	ssh := filepath.Join(dir, "ssh")
	script := `#!/bin/sh
for a; do last="$a"; done
printf '%s' "$last" > ` + dir + `/cmd
[ -e ` + dir + `/fail ] && { echo "vmfork: fork: no room" >&2; exit 1; }
echo '{"source":"fork-to-x","template":"t","pause_ms":0,"children":[{"name":"kid","pid":7,"state":"running","ports":[],"running_ms":5,"ready_ms":9}]}'
read l; printf '%s' "$l" > ` + dir + `/got
`
	if err := os.WriteFile(ssh, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	mg, _ := newTestManager(t)
	req := ForkToRequest{Source: "src", Transfer: TransferRequest{Remote: Remote{Dest: "host2"}, SSH: ssh, RemoteVmfork: "/opt/vmfork"},
		RemoteFlags: []string{"--hostname=kid {n}"}, Names: []string{"kid"}}
	res, err := mg.remoteFork(t.Context(), req, "fork-to-x", remoteHooks{})
	if err != nil || len(res.Children) != 1 || res.Children[0].Name != "kid" || res.Children[0].ReadyMS != 9 {
		t.Fatalf("remoteFork = %+v, %v", res, err)
	}
	cmd, _ := os.ReadFile(filepath.Join(dir, "cmd"))
	if want := "/opt/vmfork fork-serve --json '--hostname=kid {n}' fork-to-x kid"; string(cmd) != want {
		t.Errorf("remote command = %q, want %q", cmd, want)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "got")); string(got) != forkCommit {
		t.Errorf("the far end read %q, want the commit", got)
	}
	os.WriteFile(filepath.Join(dir, "fail"), nil, 0o600)
	if _, err := mg.remoteFork(t.Context(), req, "fork-to-x", remoteHooks{}); err == nil || !strings.Contains(err.Error(), "no room") {
		t.Errorf("remoteFork with a far end that fails = %v, want its error line", err)
	}
}
