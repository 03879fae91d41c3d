package customize

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/vmfork/vmfork/qmp"
)

// fileTools puts the host's tools that the secret-files scripts run on the
// fake guest's PATH.
func fileTools(t *testing.T, g *guestTree) {
	t.Helper()
	for _, tool := range []string{"stat", "mktemp", "mv", "chown", "readlink"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("no %s on this host", tool)
		}
		if err := os.Symlink(p, filepath.Join(g.bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
}

// execRecorder is an Agent that records the guest commands it passes on.
type execRecorder struct {
	Agent
	mu   sync.Mutex
	reqs []qmp.ExecRequest
}

func (r *execRecorder) Exec(ctx context.Context, req qmp.ExecRequest) (int, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	return r.Agent.Exec(ctx, req)
}

func runRecorded(t *testing.T, g *guestTree, sh []string, steps ...Step) (*execRecorder, *Result, error) {
	t.Helper()
	env := g.env(sh, &hostAgent{})
	rec := &execRecorder{Agent: env.Agent}
	env.Agent = rec
	res, err := Run(t.Context(), NewChain(steps...), env)
	return rec, res, err
}

func statOf(t *testing.T, g *guestTree, path string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(g.root + path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

func exists(g *guestTree, path string) bool {
	_, err := os.Lstat(g.root + path)
	return err == nil
}

func TestSecretFilesWipe(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		fileTools(t, g)
		g.file("/etc/app/cache", "the parent's session")
		g.file("/var/lib/my app/session id", "the parent's cookie")
		g.file("/etc/app/real", "kept: only the link is listed")
		if err := os.Symlink("real", g.root+"/etc/app/link"); err != nil {
			t.Fatal(err)
		}
		_, res, err := runRecorded(t, g, sh, SecretFilesWipeStep([]string{"/etc/app/cache", "/etc/none", "/var/lib/my app/session id", "/etc/app/link"}))
		if err != nil {
			t.Fatal(err)
		}
		if s := res.Steps[0]; s.Name != StepSecretFilesWipe || s.Status != StatusOK || s.Detail != "3 wiped, 1 absent (/etc/none)" {
			t.Errorf("step %+v, want ok with detail %q", s, "3 wiped, 1 absent (/etc/none)")
		}
		for _, p := range []string{"/etc/app/cache", "/var/lib/my app/session id", "/etc/app/link"} {
			if exists(g, p) {
				t.Errorf("%s is still there", p)
			}
		}
		if g.read("/etc/app/real") != "kept: only the link is listed" {
			t.Error("the link's target was touched")
		}
		// Again: every file is absent now, which is fine.
		if _, res, err = runRecorded(t, g, sh, SecretFilesWipeStep([]string{"/etc/app/cache"})); err != nil || res.Steps[0].Detail != "0 wiped, 1 absent (/etc/app/cache)" {
			t.Errorf("a second wipe: %v, detail %q", err, res.Steps[0].Detail)
		}
		// A directory is refused, not emptied.
		g.file("/etc/app/dir/keep", "x")
		_, _, err = runRecorded(t, g, sh, SecretFilesWipeStep([]string{"/etc/app/dir"}))
		if err == nil || !strings.Contains(err.Error(), "/etc/app/dir is a directory") || !exists(g, "/etc/app/dir/keep") {
			t.Errorf("wipe of a directory: %v, want a refusal naming it, the directory untouched", err)
		}
	})
}

// childValue is a RotateValue that gives each child and file a value of
// its own, as an exec hook would.
func childValue(_ context.Context, c Child, file string) ([]byte, error) {
	return fmt.Appendf(nil, "tok-%s-%d-%s\n", c.Name, c.Index, filepath.Base(file)), nil
}

func TestSecretFilesRotate(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		fileTools(t, g)
		g.file("/etc/app/token", "the parent's token\n")
		tok := g.root + "/etc/app/token"
		if err := os.Chmod(tok, 0o640); err != nil {
			t.Fatal(err)
		}
		root := os.Geteuid() == 0
		if root {
			if err := os.Chown(tok, 1234, 555); err != nil {
				t.Fatal(err)
			}
		}
		before := statOf(t, g, "/etc/app/token")
		// A reader that opened the file before keeps the old one whole:
		// the new file is renamed over it, never written in place.
		reader, err := os.Open(tok)
		if err != nil {
			t.Fatal(err)
		}
		defer reader.Close()
		g.file("/etc/app/real key", "the parent's key")
		if err := os.Symlink("real key", g.root+"/etc/app/key link"); err != nil {
			t.Fatal(err)
		}
		files := []string{"/etc/app/token", "/etc/app/key link", "/srv/new dir/db pass"}
		rec, res, err := runRecorded(t, g, sh, SecretFilesRotateStep(files, childValue))
		if err != nil {
			t.Fatal(err)
		}
		want := "2 rotated (mode 0600, owner kept); 1 created 0600 root-owned: /srv/new dir/db pass"
		if s := res.Steps[0]; s.Name != StepSecretFilesRotate || s.Status != StatusOK || s.Detail != want {
			t.Errorf("step %+v, want ok with detail %q", s, want)
		}
		for file, path := range map[string]string{"/etc/app/token": "/etc/app/token", "/etc/app/key link": "/etc/app/real key", "/srv/new dir/db pass": "/srv/new dir/db pass"} {
			if got, want := g.read(path), string(must(childValue(context.Background(), testChild(2), file))); got != want {
				t.Errorf("%s holds %q, want %q", path, got, want)
			}
			if st := statOf(t, g, path); st.Mode&0o7777 != 0o600 {
				t.Errorf("%s: mode %o, want 0600", path, st.Mode&0o7777)
			}
		}
		after := statOf(t, g, "/etc/app/token")
		if after.Uid != before.Uid || after.Gid != before.Gid {
			t.Errorf("token owner %d:%d, want %d:%d kept", after.Uid, after.Gid, before.Uid, before.Gid)
		}
		if root && after.Uid != 1234 {
			t.Errorf("token owner %d, want 1234", after.Uid)
		}
		if created := statOf(t, g, "/srv/new dir/db pass"); created.Uid != uint32(os.Geteuid()) {
			t.Errorf("a created file's owner is %d, want the guest's root (%d)", created.Uid, os.Geteuid())
		}
		if after.Ino == before.Ino {
			t.Error("the token was written in place, not replaced by a rename")
		}
		old := make([]byte, 64)
		if n, _ := reader.Read(old); string(old[:n]) != "the parent's token\n" {
			t.Errorf("a reader of the old file read %q", old[:n])
		}
		if fi, err := os.Lstat(g.root + "/etc/app/key link"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("the link was replaced: %v", err)
		}
		for _, dir := range []string{"/etc/app", "/srv/new dir"} {
			if left, _ := filepath.Glob(g.root + dir + "/.vmfork-rotate.*"); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		}
		// The values travel in the batch's environment, never on its
		// command line, which every guest user can read.
		for _, r := range rec.reqs {
			for _, a := range r.Args {
				if strings.Contains(a, "tok-") {
					t.Errorf("a value is on a guest command line: %q", a)
				}
			}
		}
		if len(rec.reqs) != 1 || !strings.Contains(strings.Join(rec.reqs[0].Env, "\n"), inputVar+"="+keyMark+" F /etc/app/token\ntok-") {
			t.Errorf("the values are not the batch's input: %d commands", len(rec.reqs))
		}
	})
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestSecretFilesRotateFailures(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		fileTools(t, g)
		g.file("/etc/app/token", "the parent's token\n")
		g.dir("/etc/app/dir")
		// A host command that fails fails the step before the guest runs
		// anything: no file changes.
		hookErr := errors.New("secret_files.rotate./etc/app/b.exec: exit status 3")
		failing := func(ctx context.Context, c Child, file string) ([]byte, error) {
			if file == "/etc/app/b" {
				return nil, hookErr
			}
			return []byte("new"), nil
		}
		rec, res, err := runRecorded(t, g, sh, SecretFilesRotateStep([]string{"/etc/app/token", "/etc/app/b"}, failing))
		if !errors.Is(err, hookErr) || !strings.Contains(err.Error(), `step "vmfork.secret-files.rotate": secret_files.rotate./etc/app/b.exec`) ||
			res.Steps[0].Status != StatusFailed || len(rec.reqs) != 0 || g.read("/etc/app/token") != "the parent's token\n" {
			t.Errorf("a failing hook: %v, %+v, %d guest commands, token %q", err, res.Steps, len(rec.reqs), g.read("/etc/app/token"))
		}
		// Values that cannot travel: the error names the file, never the value.
		for _, v := range []string{"", "S3CR\x00T", "S3CR" + keyMark + "T", "S3CR" + strings.Repeat("T", MaxSecretFileBytes)} {
			_, _, err := runRecorded(t, g, sh, SecretFilesRotateStep([]string{"/etc/app/token"}, func(context.Context, Child, string) ([]byte, error) { return []byte(v), nil }))
			if !errors.Is(err, errFileValue) || !strings.Contains(err.Error(), "/etc/app/token") || strings.Contains(err.Error(), "S3CR") {
				t.Errorf("value %.20q: %v, want an error naming the file and not the value", v, err)
			}
		}
		// A directory is refused.
		_, _, err = runRecorded(t, g, sh, SecretFilesRotateStep([]string{"/etc/app/dir"}, childValue))
		if err == nil || !strings.Contains(err.Error(), "/etc/app/dir is a directory") {
			t.Errorf("rotate of a directory: %v", err)
		}
		for _, bad := range []string{"etc/x", "/", "/a\nb"} {
			if _, _, err := runRecorded(t, g, sh, SecretFilesRotateStep([]string{bad}, childValue)); err == nil {
				t.Errorf("rotate %q: no error", bad)
			}
			if _, _, err := runRecorded(t, g, sh, SecretFilesWipeStep([]string{bad})); err == nil {
				t.Errorf("wipe %q: no error", bad)
			}
		}
	})
}
