package ledger

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakePort is a guest's virtio-serial port played by a pty: the helper
// opens the pty's slave as it would /dev/virtio-ports/org.vmfork.ledger.0
// (a character device it reads and writes), and a session of the real
// protocol serves the master, as the server serves QEMU's socket.
type fakePort struct {
	path          string
	master, slave *os.File
}

func newFakePort(t testing.TB) *fakePort {
	t.Helper()
	// Opened non-blocking and wrapped by os.NewFile, so that the master is
	// read through the poller and Close ends a pending Read (File.Fd would
	// make it blocking).
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	m := os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	// Raw: no echo, no line editing, no CR/NL mapping: a byte stream, like
	// the port.
	tio, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	tio.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	tio.Oflag &^= unix.OPOST
	tio.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	tio.Cflag &^= unix.CSIZE | unix.PARENB
	tio.Cflag |= unix.CS8
	tio.Cc[unix.VMIN], tio.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, tio); err != nil {
		t.Fatal(err)
	}
	p := &fakePort{path: fmt.Sprintf("/dev/pts/%d", n), master: m}
	// Held open so the master never reads EIO between two helpers.
	if p.slave, err = os.OpenFile(p.path, os.O_RDWR|unix.O_NOCTTY, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.master.Close()
		p.slave.Close()
	})
	return p
}

// serve answers the port as machine of family.
func (p *fakePort) serve(t testing.TB, st *Store, family, machine string) {
	s := testSession(st, family, machine, fast)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.serve(p.master)
	}()
	t.Cleanup(func() {
		p.master.Close()
		<-done
	})
}

var helperShells = []struct{ name, shell string }{
	{"dash", "dash"},
	{"busybox", "busybox sh"},
}

// helperRun runs the helper under shell and returns stdout, stderr and
// its exit code.
func helperRun(t *testing.T, shell, port string, env []string, args ...string) (string, string, int) {
	t.Helper()
	sh := strings.Fields(shell)
	if _, err := exec.LookPath(sh[0]); err != nil {
		t.Skipf("%s: %v", sh[0], err)
	}
	script := filepath.Join(t.TempDir(), HelperName)
	if err := os.WriteFile(script, Helper, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sh[0], append(append(sh[1:], script), args...)...)
	cmd.Env = append(append(os.Environ(), "VMFORK_LEDGER_PORT="+port, "VMFORK_LEDGER_LOCK="+filepath.Join(t.TempDir(), "lock")), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestHelper runs vmfork-ledger under dash and busybox sh against a fake
// port served by the real protocol, and checks what it prints and its
// exit codes.
func TestHelper(t *testing.T) {
	for _, sh := range helperShells {
		t.Run(sh.name, func(t *testing.T) {
			st := openTestStore(t, t.TempDir(), Limits{})
			pa, pb := newFakePort(t), newFakePort(t)
			pa.serve(t, st, "fam", "alpha")
			pb.serve(t, st, "fam", "beta")
			lock := "VMFORK_LEDGER_LOCK=" + filepath.Join(t.TempDir(), "lock")
			cases := []struct {
				port   *fakePort
				args   []string
				out    string // prefix of stdout
				errout string // substring of stderr
				code   int
			}{
				{pa, []string{"ping"}, "pong\n", "", 0},
				{pa, []string{"claim", "pay-42"}, "granted\n", "", 0},
				{pa, []string{"claim", "pay-42"}, "yours ", "", 0},
				{pb, []string{"claim", "pay-42"}, "taken alpha ", "", 1},
				{pb, []string{"done", "pay-42", "x"}, "", "error not holder alpha", 2},
				{pa, []string{"done", "pay-42", "receipt", "7"}, "ok\n", "", 0},
				{pa, []string{"claim", "pay-42"}, "yours ", "", 1}, // done: not again
				{pb, []string{"claim", "pay-42"}, "taken alpha ", "", 1},
				{pb, []string{"get", "pay-42"}, "done alpha ", "", 0},
				{pb, []string{"get", "nosuch"}, "none\n", "", 0},
				{pa, []string{"release", "pay-42"}, "", "error already done", 2},
				{pb, []string{"claim", "job"}, "granted\n", "", 0},
				{pb, []string{"release", "job"}, "ok\n", "", 0},
				{pa, []string{"claim", "job"}, "granted\n", "", 0},
				{pa, []string{"list"}, "job claimed alpha ", "", 0},
				{pa, []string{"claim", "a b"}, "", "bad key", 2},
				{pa, []string{"claim", strings.Repeat("k", MaxKey+1)}, "", "error key too long", 2},
				{pa, []string{"done", "job", "two\nlines"}, "", "one line", 2},
				{pa, []string{"claim"}, "", "usage:", 2},
				{pa, []string{"frobnicate", "x"}, "", "usage:", 2},
				{pa, nil, "", "usage:", 2},
			}
			for _, c := range cases {
				out, errout, code := helperRun(t, sh.shell, c.port.path, []string{lock}, c.args...)
				if !strings.HasPrefix(out, c.out) || !strings.Contains(errout, c.errout) || code != c.code {
					t.Errorf("%q: got stdout %q stderr %q exit %d; want %q, %q, %d", c.args, out, errout, code, c.out, c.errout, c.code)
				}
			}
			out, _, _ := helperRun(t, sh.shell, pa.path, []string{lock}, "list")
			if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "pay-42 done alpha ") || !strings.HasSuffix(lines[1], " receipt 7") {
				t.Errorf("list: got %q", out)
			}
			if _, errout, code := helperRun(t, sh.shell, "/nonexistent/port", nil, "ping"); code != 2 || !strings.Contains(errout, "no ledger port") {
				t.Errorf("no port: got exit %d, %q", code, errout)
			}
		})
	}
}

// TestHelperTimeout: a port nobody answers (the server is down) makes
// the helper give up after VMFORK_LEDGER_TIMEOUT with a clear message.
func TestHelperTimeout(t *testing.T) {
	for _, sh := range helperShells {
		t.Run(sh.name, func(t *testing.T) {
			p := newFakePort(t)
			start := time.Now()
			_, errout, code := helperRun(t, sh.shell, p.path, []string{"VMFORK_LEDGER_TIMEOUT=1"}, "claim", "k")
			if code != 2 || !strings.Contains(errout, "no answer from the ledger") {
				t.Fatalf("got exit %d, %q; want 2 and a timeout message", code, errout)
			}
			if d := time.Since(start); d > 4*time.Second {
				t.Fatalf("took %v with a 1s timeout", d)
			}
		})
	}
}

// TestHelperResync: answers a killed helper never read are skipped: the
// next helper reads its own answer.
func TestHelperResync(t *testing.T) {
	for _, sh := range helperShells {
		t.Run(sh.name, func(t *testing.T) {
			st := openTestStore(t, t.TempDir(), Limits{})
			p := newFakePort(t)
			// Stale bytes in the guest's input: answers to a request whose
			// helper was killed, a list among them.
			p.master.WriteString("granted\nlist 1\nx claimed a 2025-01-01T00:00:00.000Z\ntaken b 2025-01-01T00:00:00.000Z\n")
			p.serve(t, st, "fam", "m")
			if out, errout, code := helperRun(t, sh.shell, p.path, nil, "get", "k"); out != "none\n" || code != 0 {
				t.Fatalf("got %q %q exit %d; want none", out, errout, code)
			}
		})
	}
}

// TestHelperConcurrent: helpers started together in one guest take turns
// on the port (flock, or a lock directory where flock is missing), and
// each gets its own answer.
func TestHelperConcurrent(t *testing.T) {
	for _, sh := range helperShells {
		for _, lock := range []string{"flock", "mkdir"} {
			t.Run(sh.name+"/"+lock, func(t *testing.T) {
				st := openTestStore(t, t.TempDir(), Limits{})
				p := newFakePort(t)
				p.serve(t, st, "fam", "m")
				env := []string{"VMFORK_LEDGER_LOCK=" + filepath.Join(t.TempDir(), "lock")}
				if lock == "mkdir" {
					env = append(env, "PATH="+pathWithout(t, "flock"))
				}
				var wg sync.WaitGroup
				outs := make([]string, 8)
				codes := make([]int, 8)
				errs := make([]string, 8)
				took := make([]time.Duration, 8)
				for i := range 8 {
					wg.Go(func() {
						start := time.Now()
						outs[i], errs[i], codes[i] = helperRunNoT(sh.shell, p.path, env, "claim", fmt.Sprintf("c%d", i))
						took[i] = time.Since(start)
					})
				}
				wg.Wait()
				for i := range 8 {
					if outs[i] != "granted\n" || codes[i] != 0 || took[i] > 5*time.Second {
						t.Errorf("helper %d: got %q %q exit %d after %v", i, outs[i], errs[i], codes[i], took[i])
					}
				}
				if recs, _ := st.List("fam"); len(recs) != 8 {
					t.Errorf("records: got %d, want 8", len(recs))
				}
			})
		}
	}
}

// helperRunNoT is helperRun for goroutines (no t).
func helperRunNoT(shell, port string, env []string, args ...string) (string, string, int) {
	sh := strings.Fields(shell)
	dir, _ := os.MkdirTemp("", "helper")
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, HelperName)
	os.WriteFile(script, Helper, 0o755)
	cmd := exec.Command(sh[0], append(append(sh[1:], script), args...)...)
	cmd.Env = append(append(os.Environ(), "VMFORK_LEDGER_PORT="+port), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), errb.String(), ee.ExitCode()
	}
	if err != nil {
		return "", err.Error(), -1
	}
	return out.String(), errb.String(), 0
}

// pathWithout is a PATH directory holding links to what the helper runs,
// except the tool named: a guest without it.
func pathWithout(t *testing.T, missing string) string {
	dir := t.TempDir()
	for _, tool := range []string{"sleep", "date", "mkdir", "rm", "cat", "kill", "busybox", "dash"} {
		if tool == missing {
			continue
		}
		if p, err := exec.LookPath(tool); err == nil {
			os.Symlink(p, filepath.Join(dir, tool))
		}
	}
	return dir
}

// TestHelperShellcheck lints the helper as a POSIX sh script.
func TestHelperShellcheck(t *testing.T) {
	if _, err := exec.LookPath("shellcheck"); err != nil {
		t.Skip("shellcheck is not installed")
	}
	out, err := exec.Command("shellcheck", "-s", "sh", HelperName).CombinedOutput()
	if err != nil {
		t.Fatalf("shellcheck -s sh %s: %v\n%s", HelperName, err, out)
	}
}
