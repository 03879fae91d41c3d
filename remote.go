package vmfork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Push and pull run the system's ssh client and, through it, `vmfork
// template serve` on the other host, speaking transfer.go's frames over the
// session's stdin and stdout. ssh is what the hosts of a qemu+ssh:// fleet
// already trust: its keys, known_hosts, ~/.ssh/config, jump hosts and
// agent all apply, and vmfork opens no port and runs no daemon of its own.
// The other host needs vmfork on its PATH (or --remote-vmfork).

// Remote names the other host: [USER@]HOST and, for a pull or a push
// under another name, the template's name there.
type Remote struct {
	Dest string // [USER@]HOST, as ssh takes it
	Name string
}

var (
	remoteUser = `[a-z_][a-z0-9_.-]{0,31}`
	remoteHost = `[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]+\]`
	remoteRE   = regexp.MustCompile(`^((?:` + remoteUser + `@)?(?:` + remoteHost + `))(?::(.*))?$`)
)

// ParseRemote parses "[USER@]HOST[:NAME]". needName: NAME must be there.
func ParseRemote(s string, needName bool) (Remote, error) {
	m := remoteRE.FindStringSubmatch(s)
	if m == nil {
		return Remote{}, fmt.Errorf("remote %q is not [USER@]HOST[:NAME]: %w", s, ErrInvalid)
	}
	r := Remote{Dest: strings.NewReplacer("[", "", "]", "").Replace(m[1]), Name: m[2]}
	if strings.HasSuffix(s, ":") {
		return Remote{}, fmt.Errorf("remote %q: empty template name after the colon: %w", s, ErrInvalid)
	}
	if needName && r.Name == "" {
		return Remote{}, fmt.Errorf("remote %q names no template: give HOST:NAME: %w", s, ErrInvalid)
	}
	if r.Name != "" {
		if err := ValidateName(r.Name); err != nil {
			return Remote{}, fmt.Errorf("remote %q: %w", s, err)
		}
	}
	return r, nil
}

// TransferRequest is a push or pull.
type TransferRequest struct {
	// Name is the local template: the one pushed, or the name a pulled
	// template is kept as (the remote's name when empty).
	Name   string
	Remote Remote
	// SSH is the ssh command and its options ("ssh" when empty), as
	// rsync's -e takes it: split on spaces.
	SSH string
	// RemoteVmfork is the command that runs vmfork on the other host, as
	// its shell reads it ("vmfork" when empty).
	RemoteVmfork string
	// Idle is how long a session may go without a byte from the other
	// side (its keepalives included) before it is given up.
	Idle time.Duration
	// Timeout bounds the whole transfer; zero: none (Idle still applies).
	Timeout  time.Duration
	Progress func(done, total int64)
	// NoCompress: chunks travel raw even where the other side takes zstd
	// (transfer_codec.go): for a link faster than this host compresses.
	NoCompress bool
}

// TransferResult is a push's or pull's outcome. Its JSON form is a
// contract with scripts.
type TransferResult struct {
	Op   string `json:"op"`
	Host string `json:"host"`
	// Name and ID are the template on the sending host.
	Name string `json:"name"`
	ID   string `json:"id,omitempty"`
	// Received is what the receiving host made.
	Received ReceiveResult `json:"received"`
	// BytesOut and BytesIn are what crossed the SSH session, frames and
	// all, before ssh's own encryption.
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
	// Codec is the compression the two sides agreed for chunks ("zstd"),
	// absent when they travelled raw; each chunk is compressed only when
	// that pays.
	Codec string `json:"codec,omitempty"`
	// CutMS is the part of Elapsed the sender spent cutting the template
	// into its chunk store (0 when its chunk map was there; a pull's is
	// the other host's, not known here).
	CutMS   float64 `json:"cut_ms,omitempty"`
	Elapsed float64 `json:"elapsed_ms"`
}

// DefaultTransferIdle is the default for TransferRequest.Idle.
const DefaultTransferIdle = 60 * time.Second

// sshSession is a running `ssh HOST vmfork template serve`.
type sshSession struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	stderr *tailBuffer
	once   sync.Once
}

func startSSH(ctx context.Context, req TransferRequest) (*sshSession, error) {
	sshArgs := strings.Fields(req.SSH)
	if len(sshArgs) == 0 {
		sshArgs = []string{"ssh"}
	}
	remote := req.RemoteVmfork
	if remote == "" {
		remote = "vmfork"
	}
	// BatchMode: never a password prompt that waits forever; the alive
	// checks end a session whose link died within 30 s, the connect
	// timeout one whose host never answers.
	args := append(sshArgs[1:], "-o", "BatchMode=yes", "-o", "ConnectTimeout=15",
		"-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
		"--", req.Remote.Dest, remote+" template serve")
	cmd := exec.CommandContext(ctx, sshArgs[0], args...)
	s := &sshSession{cmd: cmd, stderr: &tailBuffer{max: 4096}}
	var err error
	if s.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if s.stdout, err = cmd.StdoutPipe(); err != nil {
		return nil, err
	}
	cmd.Stderr = s.stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", sshArgs[0], err)
	}
	return s, nil
}

// kill ends the session (the transfer is over, or given up).
func (s *sshSession) kill() {
	s.once.Do(func() {
		s.stdin.Close()
		if s.cmd.Process != nil {
			s.cmd.Process.Kill()
		}
		s.cmd.Wait()
	})
}

// explain adds what ssh or the remote vmfork said to an error that ended
// the session: "connection closed" alone does not say why.
func (s *sshSession) explain(err error) error {
	if line := s.stderr.lastLine(); line != "" && errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w (ssh: %s)", err, line)
	}
	return err
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	b   []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(t.b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// session runs fn over an SSH session to req's host, with the idle watch and
// the overall timeout.
func (mg *Manager) session(ctx context.Context, req TransferRequest, fn func(ctx context.Context, c *wire) error) (in, out int64, err error) {
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := startSSH(ctx, req)
	if err != nil {
		return 0, 0, err
	}
	defer s.kill()
	c := newWire(s.stdout, s.stdin, req.Remote.Dest)
	c.noCompress = req.NoCompress
	idle := req.Idle
	if idle <= 0 {
		idle = DefaultTransferIdle
	}
	var idled bool
	var mu sync.Mutex
	stop := c.watchIdle(idle, func() {
		mu.Lock()
		idled = true
		mu.Unlock()
		cancel()
		s.kill()
	})
	err = fn(ctx, c)
	stop()
	mu.Lock()
	defer mu.Unlock()
	switch {
	case err != nil && idled:
		err = fmt.Errorf("%s sent nothing for %v: gave up: %w", req.Remote.Dest, idle, err)
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		err = fmt.Errorf("transfer with %s ran past its deadline (--timeout): %w", req.Remote.Dest, err)
	case err != nil:
		err = s.explain(err)
	}
	return c.in.Load(), c.out.Load(), err
}

// converse is one push or pull over an SSH session to req's host: hello
// opens it, side (sendTemplate or receiveTemplate) runs this host's part,
// and res gets what the receiver made and the bytes that crossed.
func (mg *Manager) converse(ctx context.Context, req TransferRequest, res *TransferResult, hello transferHello, side func(ctx context.Context, c *wire) (*ReceiveResult, error)) error {
	var err error
	res.BytesIn, res.BytesOut, err = mg.session(ctx, req, func(ctx context.Context, c *wire) error {
		if err := c.sendJSON(hello); err != nil {
			return err
		}
		got, err := side(ctx, c)
		res.Codec = c.codec
		if got != nil {
			res.Received = *got
		}
		return err
	})
	return err
}

// Push sends kept template req.Name to req.Remote (kept there as
// Remote.Name, or under its own name).
func (mg *Manager) Push(ctx context.Context, req TransferRequest) (*TransferResult, error) {
	start := time.Now()
	if err := checkLocalName(req.Name); err != nil {
		return nil, err
	}
	fail := func(err error) (*TransferResult, error) {
		return nil, fmt.Errorf("push %s to %s: %w", req.Name, req.Remote.Dest, err)
	}
	m, err := mg.chunked(ctx, req.Name)
	if err != nil {
		return fail(err)
	}
	res := &TransferResult{Op: "push", Host: req.Remote.Dest, Name: m.Template.Name, ID: m.Template.ID, CutMS: m.cutMS}
	err = mg.converse(ctx, req, res, transferHello{Proto: transferProto, Op: "receive", Name: req.Remote.Name},
		func(ctx context.Context, c *wire) (*ReceiveResult, error) {
			return mg.sendTemplate(ctx, c, m, req.Progress)
		})
	if err != nil {
		return fail(err)
	}
	res.Elapsed = ms(time.Since(start))
	return res, nil
}

// Pull fetches template req.Remote.Name from req.Remote and keeps it here as
// req.Name (or the remote name).
func (mg *Manager) Pull(ctx context.Context, req TransferRequest) (*TransferResult, error) {
	start := time.Now()
	name := req.Name
	if name == "" {
		name = req.Remote.Name
	}
	fail := func(err error) (*TransferResult, error) {
		return nil, fmt.Errorf("pull %s:%s: %w", req.Remote.Dest, req.Remote.Name, err)
	}
	if err := ValidateName(name); err != nil {
		return fail(err)
	}
	if k, err := mg.Store.FindKept(name); err == nil {
		return fail(fmt.Errorf("template %s is kept as %q here: %w", k.ID, name, ErrExists))
	}
	res := &TransferResult{Op: "pull", Host: req.Remote.Dest, Name: req.Remote.Name}
	err := mg.converse(ctx, req, res, transferHello{Proto: transferProto, Op: "send", Name: req.Remote.Name},
		func(ctx context.Context, c *wire) (*ReceiveResult, error) {
			return mg.receiveTemplate(ctx, c, name, req.Progress)
		})
	if err != nil {
		return fail(err)
	}
	res.Elapsed = ms(time.Since(start))
	return res, nil
}

func checkLocalName(name string) error {
	if validateTemplateID(name) == nil {
		return nil
	}
	return ValidateName(name)
}

// chunked returns template name's chunk manifest, cutting it into the
// store if need be, under its lock as Export takes it.
func (mg *Manager) chunked(ctx context.Context, name string) (*chunkManifest, error) {
	lockName := name
	if m := templateIDPattern.FindStringSubmatch(name); m != nil {
		lockName = m[1]
	}
	unlock, err := mg.Store.Lock(ctx, lockName)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	release := func() { once.Do(unlock) }
	defer release()
	t, err := mg.Store.findTemplate(name)
	if err != nil {
		return nil, err
	}
	// A chunk map names one full RAM file, as an archive does (delta.go):
	// a delta template (a live fork's) is compacted first.
	if t.HasMemory {
		if err := mg.Store.CompactRAM(ctx, t); err != nil {
			return nil, err
		}
	}
	unlockStore, err := mg.Store.chunkStore().lock(false)
	if err != nil {
		return nil, err
	}
	defer unlockStore()
	return mg.Store.chunkTemplate(ctx, t, release)
}

// Serve is `vmfork template serve`: the other end of a push or pull, on r
// and w (the SSH session's stdin and stdout). It gives up when nothing has
// come for idle, exiting through abort.
func (mg *Manager) Serve(ctx context.Context, r io.Reader, w io.Writer, idle time.Duration, abort func()) error {
	c := newWire(r, w, "the other host")
	if idle <= 0 {
		idle = DefaultTransferIdle
	}
	stop := c.watchIdle(idle, abort)
	defer stop()
	var hello transferHello
	if err := c.recvJSON(&hello); err != nil {
		return err
	}
	if hello.Proto != transferProto {
		err := fmt.Errorf("transfer protocol %d, this vmfork speaks %d: %w", hello.Proto, transferProto, ErrUnsupported)
		c.sendError(err)
		return err
	}
	switch hello.Op {
	case "receive":
		if hello.Name != "" {
			if err := ValidateName(hello.Name); err != nil {
				c.sendError(err)
				return err
			}
		}
		_, err := mg.receiveTemplate(ctx, c, hello.Name, nil)
		return err
	case "send":
		if err := checkLocalName(hello.Name); err != nil {
			c.sendError(err)
			return err
		}
		alive := c.working(keepaliveEvery)
		m, err := mg.chunked(ctx, hello.Name)
		alive()
		if err != nil {
			c.sendError(err)
			return err
		}
		_, err = mg.sendTemplate(ctx, c, m, nil)
		return err
	}
	err := fmt.Errorf("unknown transfer %q: %w", hello.Op, ErrInvalid)
	c.sendError(err)
	return err
}
