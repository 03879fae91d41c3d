package vmfork

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestCheckIncomingSocket(t *testing.T) {
	for s, ok := range map[string]bool{
		"/tmp/vmfork-mig-0123456789ab/m.sock":     true,
		"/tmp/vmfork-mig-0123456789AB/m.sock":     false,
		"/tmp/vmfork-mig-0123456789ab/../m.sock":  false,
		"/tmp/vmfork-mig-0123456789a/m.sock":      false,
		"/var/run/vmfork-mig-0123456789ab/m.sock": false,
		"": false,
	} {
		if err := CheckIncomingSocket(s); (err == nil) != ok {
			t.Errorf("CheckIncomingSocket(%q) = %v, want ok %v", s, err, ok)
		}
	}
	local, remote := liveSockets()
	if err := CheckIncomingSocket(remote); err != nil {
		t.Errorf("liveSockets' remote socket %q: %v", remote, err)
	}
	if !strings.HasPrefix(filepath.Base(local), "vmfork-fwd-") || len(local) > 100 {
		t.Errorf("liveSockets' local socket %q", local)
	}
}

// The live path where it can run, copy where it cannot; postcopy asked
// where it cannot run says why.
func TestResolveForkToMode(t *testing.T) {
	mg, _ := newTestManager(t) // the fake driver has no live path
	if live, err := mg.resolveForkToMode(ForkToAuto, 1, nil); live || err != nil {
		t.Errorf("auto on a driver without the live path = %v, %v; want copy", live, err)
	}
	if _, err := mg.resolveForkToMode(ForkToPostcopy, 1, nil); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "no live path") {
		t.Errorf("postcopy on a driver without the live path = %v", err)
	}
	if _, err := mg.resolveForkToMode("fast", 1, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("mode fast = %v, want ErrInvalid", err)
	}
	mg.Driver = liveFake{mg.Driver}
	for _, c := range []struct {
		mode     string
		children int
		tpl      *Template
		live     bool
		err      string
	}{
		{ForkToAuto, 1, nil, true, ""},
		{"", 1, &Template{ID: "t", HasMemory: true}, true, ""},
		{ForkToCopy, 1, nil, false, ""},
		{ForkToAuto, 2, nil, false, ""},
		{ForkToPostcopy, 2, nil, false, "2 children"},
		{ForkToPostcopy, 1, &Template{ID: "t"}, false, "holds no memory"},
		{ForkToPostcopy, 1, &Template{ID: "t", HasMemory: true, Disks: []TemplateDisk{{ID: "d"}}}, false, "extra disks"},
	} {
		live, err := mg.resolveForkToMode(c.mode, c.children, c.tpl)
		if live != c.live || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("resolveForkToMode(%q, %d, %+v) = %v, %v; want %v, %q", c.mode, c.children, c.tpl, live, err, c.live, c.err)
		}
	}
}

// liveFake is a driver that claims the live path (for the mode's choice).
type liveFake struct{ Driver }

func (liveFake) LoadTemplate(context.Context, *Template, string) (LoadedTemplate, error) {
	return nil, ErrUnsupported
}

func (liveFake) StartIncoming(context.Context, *Machine, *Template, string, func() error) error {
	return ErrUnsupported
}

func (liveFake) IncomingStatus(context.Context, *Machine) (string, error) { return "", nil }

// The client end of the live path: the control lines before the result go
// to the hook in order, the commit waits for beforeCommit, and an
// unexpected line or a failed migration aborts without the commit.
func TestRemoteForkLiveLines(t *testing.T) {
	dir := t.TempDir()
	ssh := filepath.Join(dir, "ssh")
	script := `#!/bin/sh
printf '%s\n' "$@" > ` + dir + `/args
echo listening
echo ${LINE:-running}
echo '{"source":"fork-to-x","template":"t","pause_ms":0,"children":[{"name":"kid","pid":7,"state":"running","ports":[],"running_ms":5,"ready_ms":9}]}'
read l; printf '%s' "$l" > ` + dir + `/got
`
	if err := os.WriteFile(ssh, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	mg, _ := newTestManager(t)
	req := ForkToRequest{Source: "src", Transfer: TransferRequest{Remote: Remote{Dest: "host2"}, SSH: ssh}, Names: []string{"kid"}}
	var seen []string
	var commitErr error
	h := remoteHooks{
		sshOpts: []string{"-L", "/tmp/a.sock:/tmp/vmfork-mig-0123456789ab/m.sock"},
		flags:   []string{"--incoming=/tmp/vmfork-mig-0123456789ab/m.sock"},
		onLine: func(l string) error {
			seen = append(seen, l)
			return map[bool]error{true: errors.New("unexpected line")}[l == "bogus"]
		},
		beforeCommit: func() error { seen = append(seen, "check"); return commitErr },
	}
	res, err := mg.remoteFork(t.Context(), req, "fork-to-x", h)
	if err != nil || len(res.Children) != 1 {
		t.Fatalf("remoteFork = %+v, %v", res, err)
	}
	if want := []string{liveListening, liveRunning, "check"}; !slices.Equal(seen, want) {
		t.Errorf("hooks saw %q, want %q", seen, want)
	}
	args, _ := os.ReadFile(filepath.Join(dir, "args"))
	if !strings.Contains(string(args), "-L\n/tmp/a.sock:/tmp/vmfork-mig-0123456789ab/m.sock\n--\nhost2\n") ||
		!strings.Contains(string(args), "fork-serve --json --incoming=/tmp/vmfork-mig-0123456789ab/m.sock fork-to-x kid") {
		t.Errorf("ssh args:\n%s", args)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "got")); string(got) != forkCommit {
		t.Errorf("the far end read %q, want the commit", got)
	}
	for _, c := range []struct{ line, err string }{{"bogus", "unexpected line"}, {"running", "migration broke"}} {
		os.Remove(filepath.Join(dir, "got"))
		t.Setenv("LINE", c.line)
		commitErr = nil
		if c.line == "running" {
			commitErr = errors.New("migration broke")
		}
		if _, err := mg.remoteFork(t.Context(), req, "fork-to-x", h); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("line %q: remoteFork = %v, want %q", c.line, err, c.err)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "got")); string(got) == forkCommit {
			t.Errorf("line %q: committed", c.line)
		}
	}
}

// A template kept under a fork --to's name is given up by gc's reaping an
// hour after its freeze (its fork's link died before either side could);
// a younger one, and one of any other name, stay.
func TestReapGivesUpOrphanedForkToTemplates(t *testing.T) {
	mg, _ := newTestManager(t)
	bootFake(t, mg, "src")
	for _, name := range []string{"fork-to-0123456789ab", "fork-to-golden"} {
		if _, err := mg.Keep(t.Context(), KeepRequest{Source: "src", Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	k, err := mg.Store.FindKept("fork-to-0123456789ab")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Reap(t.Context(), k.Created.Add(ForkToOrphanAfter-time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Store.FindKept("fork-to-0123456789ab"); err != nil {
		t.Errorf("a fork-to template younger than %v was given up: %v", ForkToOrphanAfter, err)
	}
	res, err := mg.Reap(t.Context(), k.Created.Add(ForkToOrphanAfter+time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Released, []string{"fork-to-0123456789ab"}) {
		t.Errorf("reaped %v, want the orphaned fork-to template alone", res.Released)
	}
	if _, err := mg.Store.FindKept("fork-to-0123456789ab"); !errors.Is(err, ErrNotFound) {
		t.Errorf("the orphaned fork-to template is still kept: %v", err)
	}
	if _, err := mg.Store.FindKept("fork-to-golden"); err != nil {
		t.Errorf("a template of another name was given up: %v", err)
	}
}

// TestSweepLoaded: a loaded QEMU's directory goes once the vmfork that made
// it is gone, never while it runs; names without a pid are left alone.
func TestSweepLoaded(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	mk := func(name string) string {
		p := filepath.Join(tmp, name)
		if err := os.MkdirAll(filepath.Join(p, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gone := mk(loadedPrefix + strconv.Itoa(dead.Process.Pid) + "-123")
	mine := mk(loadedPrefix + strconv.Itoa(os.Getpid()) + "-456")
	old := mk(loadedPrefix + "abcdef")
	other := mk("vmfork-other-1-2")
	goneSock := filepath.Join(tmp, fwdPrefix+strconv.Itoa(dead.Process.Pid)+"-0123456789ab.sock")
	mySock := filepath.Join(tmp, fwdPrefix+strconv.Itoa(os.Getpid())+"-0123456789ab.sock")
	for _, p := range []string{goneSock, mySock} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sweepLoaded()
	for _, p := range []string{gone, goneSock} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s: a dead vmfork's leftover was kept (%v)", p, err)
		}
	}
	for _, p := range []string{mine, old, other, mySock} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: removed: %v", p, err)
		}
	}
}

// TestForkToAbandoned: a fork --to's template is abandoned only once the
// vmfork holding it is gone (its lock file left unlocked), never while it
// runs, and a name without the file (pushed here by another host) or not
// a fork --to's is not.
func TestForkToAbandoned(t *testing.T) {
	s := newTestStore(t)
	const name = "fork-to-0123456789ab"
	release, err := s.holdForkTo(name)
	if err != nil {
		t.Fatal(err)
	}
	if s.forkToAbandoned(name) {
		t.Errorf("%s: abandoned while its fork holds it", name)
	}
	release()
	if s.forkToAbandoned(name) {
		t.Errorf("%s: abandoned after its fork ended cleanly (no file left)", name)
	}
	// A vmfork killed mid-fork: the file stays, its lock went with it.
	path := filepath.Join(s.StateDir, dirLocks, name+".sending")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !s.forkToAbandoned(name) {
		t.Errorf("%s: not abandoned with its holder gone", name)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("%s: file kept after it was found abandoned (%v)", path, err)
	}
	if err := os.WriteFile(filepath.Join(s.StateDir, dirLocks, "golden.sending"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if s.forkToAbandoned("golden") {
		t.Errorf("golden: not a fork --to's name, found abandoned")
	}
}
