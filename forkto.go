package vmfork

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// A fork onto another host (`vmfork fork SOURCE --to [USER@]HOST`, issue
// 24 item 2). Two paths, docs/TEMPLATES.md "A fork onto another host". The
// copy path (here): the source's instant is frozen into a template here
// exactly as for a local fork (the same pause), the template travels by
// push (only the chunks the other host lacks), and `vmfork fork-serve` on
// the other host, run through ssh, forks it there: the child's identity
// chain runs there as for a local child. The live path (forkto_live.go):
// the same freeze, only the disks pushed, and the child started there by
// postcopy migration from a QEMU loaded from the template here, so that it
// runs before its RAM has arrived.
//
// Nothing half-made: the template is kept on each host under a name of
// this fork's own for the fork's length only. The other host's fork-serve
// prints its result and then waits for this side's "commit"; a session
// that ends before the commit (the link died, this vmfork was killed) makes
// it remove every child it made. A push cut mid-transfer leaves no
// template there (transfer.go stages it). The source is never paused
// after its freeze, whatever fails.

// ForkToRequest is a fork onto another host.
type ForkToRequest struct {
	Source string
	// Transfer carries the host (Remote.Dest) and the ssh settings that a
	// push takes; its Name and Remote.Name are set by ForkTo.
	Transfer TransferRequest
	// Identity supplies the source's pre-fork hooks, run before the freeze.
	Identity IdentityOptions
	// RemoteFlags are the fork's flags on the other host ("--name=value",
	// as `vmfork fork` takes them) and Names its children's names; the
	// caller has checked them.
	RemoteFlags []string
	Names       []string
	// Mode is ForkToAuto (""), ForkToCopy or ForkToPostcopy
	// (forkto_live.go).
	Mode string
	// Migrate tunes the live path's migration (tests slow it, to cut the
	// link inside it).
	Migrate MigrateOptions
}

// ForkToResult is a fork onto another host's outcome. Its JSON form is a
// contract with scripts.
type ForkToResult struct {
	Host   string `json:"host"`
	Source string `json:"source"`
	// Mode is the path taken: "copy" (the template pushed whole, then
	// forked there) or "postcopy" (the live path, forkto_live.go).
	Mode string `json:"mode"`
	// Migration is the live path's migration; LoadedMS is when the QEMU
	// loaded from the template here was ready to migrate.
	Migration *MigrationStats `json:"migration,omitempty"`
	LoadedMS  float64         `json:"loaded_ms,omitempty"`
	// PauseMS is the source's pause for the freeze (0 for a kept template).
	PauseMS float64 `json:"pause_ms"`
	// Push is the template's transfer; Fork is the fork on the other host,
	// whose children are machines there.
	Push *TransferResult `json:"push"`
	Fork *ForkResult     `json:"fork"`
	// The phases, in ms from the start: the freeze here, the push, and the
	// fork there (its children's own running_ms and ready_ms are in Fork).
	FreezeMS     float64 `json:"freeze_ms"`
	PushMS       float64 `json:"push_ms"`
	RemoteForkMS float64 `json:"remote_fork_ms"`
	// RunningMS and ReadyMS are from the start of this fork until the
	// first child ran, and until the last was ready, on the other host.
	RunningMS float64 `json:"running_ms"`
	ReadyMS   float64 `json:"ready_ms"`
	Elapsed   float64 `json:"elapsed_ms"`
}

// forkToName is the name a fork onto another host keeps its template
// under, here and there, for the fork's length.
func forkToName() string {
	var b [6]byte
	rand.Read(b[:])
	return "fork-to-" + hex.EncodeToString(b[:])
}

// ForkTo forks req.Source onto the host req.Transfer.Remote.Dest.
func (mg *Manager) ForkTo(ctx context.Context, req ForkToRequest) (res *ForkToResult, err error) {
	start := time.Now()
	host := req.Transfer.Remote.Dest
	res = &ForkToResult{Host: host, Source: req.Source}
	fail := func(err error) (*ForkToResult, error) {
		return nil, fmt.Errorf("fork %s onto %s: %w", req.Source, host, err)
	}
	if err := checkLocalName(req.Source); err != nil {
		return fail(err)
	}
	tmp := forkToName()
	local := req.Source
	kept, kerr := mg.Store.FindKept(req.Source)
	// Before anything is paused: whether the live path can run.
	shape := kept
	if kerr != nil {
		// A machine: its template will hold memory if it runs, and its
		// extra disks.
		if m, merr := mg.Store.LoadMachine(req.Source); merr == nil {
			shape = &Template{ID: req.Source, HasMemory: m.State == StateRunning, Disks: make([]TemplateDisk, len(m.Spec.Disks))}
		}
	}
	live, err := mg.resolveForkToMode(req.Mode, max(1, len(req.Names)), shape)
	if err != nil {
		return fail(err)
	}
	res.Mode = ForkToCopy
	if live {
		res.Mode = ForkToPostcopy
	}
	if kerr != nil {
		// Held from before the freeze to after the template is given up
		// (this defer runs last): gc tells an abandoned one by it.
		release, err := mg.Store.holdForkTo(tmp)
		if err != nil {
			return fail(err)
		}
		defer release()
	}
	if kerr != nil {
		// A machine: its instant frozen as for a local fork.
		// The live path's freeze is a local fork's (its RAM a delta
		// where the driver can): the template's RAM is only ever mapped
		// by the QEMU loaded from it here, never pushed.
		t, err := mg.Keep(ctx, KeepRequest{Source: req.Source, Name: tmp, Identity: req.Identity, delta: live})
		if err != nil {
			return fail(err)
		}
		res.PauseMS = t.PauseMS
		local = tmp
		defer func() {
			// The template's data stays as long as the source's disk
			// chain needs it (collectTemplates), as a local fork's does.
			if _, uerr := mg.Unkeep(context.WithoutCancel(ctx), tmp); uerr != nil {
				mg.Log.WithError(uerr).WithField("template", tmp).Warn("could not give up the fork's template")
			}
		}()
	}
	res.FreezeMS = ms(time.Since(start))
	pushed := false
	defer func() {
		if err != nil && pushed {
			mg.giveUpRemote(ctx, req.Transfer, tmp)
		}
	}()
	if live {
		pushed = true // from the first byte: a cut push may still install it
		if err = mg.forkToLive(ctx, req, res, start, local, tmp); err != nil {
			return fail(err)
		}
		res.Elapsed = ms(time.Since(start))
		return res, nil
	}

	push := req.Transfer
	push.Name, push.Remote.Name = local, tmp
	pushed = true
	if res.Push, err = mg.Push(ctx, push); err != nil {
		return fail(err)
	}
	res.PushMS = ms(time.Since(start))

	if res.Fork, err = mg.remoteFork(ctx, req, tmp, remoteHooks{}); err != nil {
		return fail(err)
	}
	res.RemoteForkMS = ms(time.Since(start))
	// The children's times count from their own creation, which began
	// when the remote fork did: its share of this fork is PushMS on.
	for i, c := range res.Fork.Children {
		run, ready := res.PushMS+c.RunningMS, res.PushMS+c.ReadyMS
		if i == 0 || run < res.RunningMS {
			res.RunningMS = run
		}
		res.ReadyMS = max(res.ReadyMS, ready)
	}
	res.Elapsed = ms(time.Since(start))
	return res, nil
}

// remoteHooks are what the live path adds to a remote fork: ssh options
// (the forward), fork-serve flags, a handler for the control lines before
// the result, and a check before the commit.
type remoteHooks struct {
	sshOpts, flags []string
	onLine         func(line string) error
	beforeCommit   func() error
}

// remoteFork runs `vmfork fork-serve TEMPLATE ARGS...` on the other host,
// reads its result and commits it.
func (mg *Manager) remoteFork(ctx context.Context, req ForkToRequest, tmpl string, h remoteHooks) (*ForkResult, error) {
	tr := req.Transfer
	sshArgs := strings.Fields(tr.SSH)
	if len(sshArgs) == 0 {
		sshArgs = []string{"ssh"}
	}
	remote := tr.RemoteVmfork
	if remote == "" {
		remote = "vmfork"
	}
	// Flags first, then the template and the names (which never start
	// with '-'): no "--", after which the flags would be names.
	words := []string{remote, "fork-serve", "--json"}
	for _, a := range append(append(append(append([]string{}, h.flags...), req.RemoteFlags...), tmpl), req.Names...) {
		words = append(words, ShellQuote(a))
	}
	args := append(append(sshArgs[1:], "-o", "BatchMode=yes", "-o", "ConnectTimeout=15",
		"-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3"), h.sshOpts...)
	args = append(args, "--", tr.Remote.Dest, strings.Join(words, " "))
	cmd := exec.CommandContext(ctx, sshArgs[0], args...)
	stderr := &tailBuffer{max: 4096}
	cmd.Stderr = stderr
	cmd.WaitDelay = 5 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", sshArgs[0], err)
	}
	// Closing stdin without the commit, or killing ssh, makes the other
	// side remove what it made.
	abort := func(err error) (*ForkResult, error) {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
		if line := stderr.lastLine(); line != "" {
			return nil, fmt.Errorf("fork on %s: %w (%s)", tr.Remote.Dest, err, line)
		}
		return nil, fmt.Errorf("fork on %s: %w", tr.Remote.Dest, err)
	}
	br := bufio.NewReader(stdout)
	line, err := br.ReadBytes('\n')
	for err == nil && len(line) > 0 && line[0] != '{' && h.onLine != nil {
		if herr := h.onLine(strings.TrimSpace(string(line))); herr != nil {
			return abort(herr)
		}
		line, err = br.ReadBytes('\n')
	}
	if err != nil {
		return abort(fmt.Errorf("no result: %w", io.ErrUnexpectedEOF))
	}
	var fr ForkResult
	if err := json.Unmarshal(line, &fr); err != nil {
		return abort(fmt.Errorf("unreadable result: %w", err))
	}
	if len(fr.Children) == 0 {
		return abort(errors.New("no child came up"))
	}
	if h.beforeCommit != nil {
		if err := h.beforeCommit(); err != nil {
			return abort(err)
		}
	}
	if _, err := io.WriteString(stdin, forkCommit+"\n"); err != nil {
		return abort(fmt.Errorf("commit: %w", err))
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		// The commit may not have arrived: the other side then removes its
		// children, and this fork failed.
		if line := stderr.lastLine(); line != "" {
			err = fmt.Errorf("%w (%s)", err, line)
		}
		return nil, fmt.Errorf("fork on %s: after its result: %w", tr.Remote.Dest, err)
	}
	return &fr, nil
}

// forkCommit is the line that makes a fork-serve keep its children.
const forkCommit = "commit"

// ServeFork is the other host's end of a fork onto it (`vmfork fork-serve`):
// run the fork (req.Source is the pushed template), write its result to w
// as one JSON line, and keep the children only if r then says commit
// within idle; otherwise, and on any failure, remove every child made. The
// pushed template is given up in every case (its data stays while children
// map it).
//
// incoming, when set, is the live path's unix socket: the children's
// state and RAM come by postcopy migration there (forkto_live.go), and the
// result is written only once their whole RAM has arrived.
func (mg *Manager) ServeFork(ctx context.Context, req ForkRequest, incoming string, r io.Reader, w io.Writer, idle time.Duration) (res *ForkResult, err error) {
	defer func() {
		if _, uerr := mg.Unkeep(context.WithoutCancel(ctx), req.Source); uerr != nil && !errors.Is(uerr, ErrNotFound) {
			mg.Log.WithError(uerr).WithField("template", req.Source).Warn("could not give up the pushed template")
		}
	}()
	var lines sync.Mutex
	if incoming != "" {
		// The live path (forkto_live.go): the socket's directory is this
		// fork's own, made here; one that exists is refused.
		if err := CheckIncomingSocket(incoming); err != nil {
			return nil, err
		}
		dir := filepath.Dir(incoming)
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, fmt.Errorf("--incoming: %w", err)
		}
		defer os.RemoveAll(dir)
		say := func(l string) error {
			lines.Lock()
			defer lines.Unlock()
			_, err := io.WriteString(w, l+"\n")
			return err
		}
		req.incoming = &incomingHooks{sock: incoming,
			listening: func() error { return say(liveListening) },
			running:   func() { say(liveRunning) }}
	}
	res, err = mg.Fork(ctx, req)
	undo := func() {
		if res == nil {
			return
		}
		for _, c := range res.Children {
			if rerr := mg.Remove(context.WithoutCancel(ctx), c.Name, true); rerr != nil {
				mg.Log.WithError(rerr).WithField("machine", c.Name).Warn("could not remove an uncommitted child")
			}
		}
	}
	if err != nil {
		undo() // a partial fork is a failed one: all or nothing
		return nil, err
	}
	if incoming != "" {
		for _, c := range res.Children {
			m, lerr := mg.Store.LoadMachine(c.Name)
			if lerr == nil {
				lerr = mg.awaitIncoming(ctx, m)
			}
			if lerr != nil {
				undo()
				return nil, lerr
			}
		}
	}
	lines.Lock()
	defer lines.Unlock()
	line, merr := json.Marshal(res)
	if merr != nil {
		undo()
		return nil, merr
	}
	if _, werr := w.Write(append(line, '\n')); werr != nil {
		undo()
		return nil, fmt.Errorf("send the result: %w", werr)
	}
	got := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(r).ReadString('\n')
		got <- strings.TrimSpace(l)
	}()
	if idle <= 0 {
		idle = DefaultTransferIdle
	}
	select {
	case l := <-got:
		if l == forkCommit {
			return res, nil
		}
		undo()
		return nil, errors.New("the other host did not commit the fork (its session ended): the children are removed")
	case <-time.After(idle):
		undo()
		return nil, fmt.Errorf("no commit from the other host for %v: its children are removed", idle)
	}
}

// ShellQuote quotes s for a POSIX shell (ssh hands its command to one).
func ShellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,@%+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// giveUpRemote removes the fork's pushed template tmp on the other host
// after a failure, over a session of its own (the fork's may be the one
// that died). fork-serve gives it up too, but a fork-serve killed by the
// session's hang-up before it could (the moment it starts) would leave it
// kept there; its data stays while a child maps it. Best effort: a link
// that stays dead leaves it, named fork-to-..., for `template rm`.
func (mg *Manager) giveUpRemote(ctx context.Context, tr TransferRequest, tmp string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	sshArgs := strings.Fields(tr.SSH)
	if len(sshArgs) == 0 {
		sshArgs = []string{"ssh"}
	}
	remote := tr.RemoteVmfork
	if remote == "" {
		remote = "vmfork"
	}
	args := append(sshArgs[1:], "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
		"--", tr.Remote.Dest, remote+" template rm "+ShellQuote(tmp))
	cmd := exec.CommandContext(ctx, sshArgs[0], args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		// Usually gone already (fork-serve gave it up): debug only.
		mg.Log.WithError(err).WithField("template", tmp).WithField("host", tr.Remote.Dest).Debug("giving up the fork's template on the other host: " + strings.TrimSpace(string(out)))
	}
}
