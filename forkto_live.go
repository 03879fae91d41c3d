package vmfork

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/overlay"
)

// The live path of a fork onto another host (issue 24 item 2,
// docs/TEMPLATES.md "The live path"): the child runs on HOST before its
// RAM has arrived. The source's instant is frozen into a template here as
// for the copy path (the same pause); the template goes to HOST without
// its RAM (the disk layers: usually a delta); a QEMU loaded from it here
// (LiveForker.LoadTemplate, paused, the template's RAM mapped share=off)
// migrates with postcopy to the child's QEMU on HOST, started by
// fork-serve --incoming, which runs as soon as the device state is there
// and fetches the pages it touches on fault while the rest streams.
//
// The channel: the fork-serve session's own ssh connection forwards a
// unix socket here to the one HOST's QEMU listens on (ssh -L
// LOCAL:REMOTE; OpenSSH's stream-local forwarding, on by default in
// sshd). One connection carries the control lines and the migration, so a
// cut link ends both at once, no port is opened on any address, and ssh's
// keys and config are the only trust. (The other choice, the session's
// stdin/stdout bridged to a socketpair handed to each QEMU, would
// multiplex the control lines into the stream: more code for nothing.)
//
// The control lines fork-serve --incoming writes before its result:
// "listening" once HOST's QEMU listens (this side then migrates), and
// "running" once the child runs there (this side's RUNNING). The result
// comes once the child is READY and its whole RAM has arrived: only then
// may it be committed, since until then the link dies with the child's RAM
// split across the hosts (such a child is killed and removed there: a
// lost child, never a half-made one left listed).

// Fork --to modes (ForkToRequest.Mode).
const (
	ForkToAuto     = "auto"
	ForkToCopy     = "copy"
	ForkToPostcopy = "postcopy"
)

// LiveForker is the optional driver capability behind fork --to's live
// path (qemudrv/live.go, libvirtdrv/live.go).
type LiveForker interface {
	// LoadTemplate starts, in dir (which it removes on Close), a QEMU
	// loaded from template t as a child would be, left paused. On error
	// nothing of it is left.
	LoadTemplate(ctx context.Context, t *Template, dir string) (LoadedTemplate, error)
	// StartIncoming starts child from t's devices with RAM of its own,
	// its state and RAM to come by postcopy migration on unix socket
	// sock; it calls listening once QEMU listens, and returns once the
	// child runs, its NIC link down. On error no process of child is
	// left.
	StartIncoming(ctx context.Context, child *Machine, t *Template, sock string, listening func() error) error
	// IncomingStatus is m's incoming migration's state (QEMU's
	// MigrationStatus), "" when m's QEMU is gone.
	IncomingStatus(ctx context.Context, m *Machine) (string, error)
}

// LoadedTemplate is LiveForker.LoadTemplate's QEMU.
type LoadedTemplate interface {
	// Migrate migrates it with postcopy to the QEMU listening at sock,
	// calls started once that one may run, and returns once the migration
	// completed.
	Migrate(ctx context.Context, sock string, opt MigrateOptions, started func()) (MigrationStats, error)
	// Close kills it and removes its files.
	Close()
}

// MigrateOptions tune a live fork's migration; the zero value is the
// product's (postcopy at once, no bound).
type MigrateOptions struct {
	// MaxBandwidth > 0 bounds the migration, in bytes/s.
	MaxBandwidth int64
	// PrecopyFor delays the switch to postcopy (tests cut the link before
	// it).
	PrecopyFor time.Duration
}

// MigrationStats is a live fork's migration. Its JSON form is a contract
// with scripts.
type MigrationStats struct {
	Status string `json:"status"`
	// Bytes is what QEMU sent of the RAM.
	Bytes int64 `json:"ram_bytes"`
	// SwitchoverMS is from migrate until postcopy ran, TotalMS until the
	// whole RAM was there.
	SwitchoverMS float64 `json:"switchover_ms"`
	TotalMS      float64 `json:"total_ms"`
}

// Control lines of fork-serve --incoming (before its result line).
const (
	liveListening = "listening"
	liveRunning   = "running"
)

// incomingSockRE is the form of fork-serve --incoming's socket: a
// directory of this fork's own under /tmp (made by fork-serve, mode 0700,
// refused when it exists: no one else's socket is ever used).
var incomingSockRE = regexp.MustCompile(`^/tmp/vmfork-mig-[0-9a-f]{12}/m\.sock$`)

// CheckIncomingSocket checks fork-serve --incoming's value.
func CheckIncomingSocket(s string) error {
	if !incomingSockRE.MatchString(s) {
		return fmt.Errorf("--incoming %q is not /tmp/vmfork-mig-<12 hex>/m.sock: %w", s, ErrInvalid)
	}
	return nil
}

// incomingHooks are a fork-serve --incoming's: its socket, and the control
// lines to write.
type incomingHooks struct {
	sock      string
	listening func() error
	running   func()
}

// ResolveForkToMode says whether a fork onto another host takes the live
// path: mode ForkToPostcopy insists (an error says why it cannot),
// ForkToAuto takes it where it can, ForkToCopy never.
func (mg *Manager) resolveForkToMode(mode string, children int, t *Template) (bool, error) {
	why := ""
	_, ok := mg.Driver.(LiveForker)
	switch {
	case !ok:
		why = fmt.Sprintf("driver %q has no live path", mg.Driver.Name())
	case children != 1:
		why = fmt.Sprintf("%d children: one migration makes one child", children)
	case t != nil && !t.HasMemory:
		why = fmt.Sprintf("template %s holds no memory", t.ID)
	case t != nil && len(t.Disks) > 0:
		why = "the source has extra disks"
	}
	switch mode {
	case ForkToCopy:
		return false, nil
	case ForkToPostcopy:
		if why != "" {
			return false, fmt.Errorf("--to-mode postcopy: %s: %w", why, ErrUnsupported)
		}
		return true, nil
	case "", ForkToAuto:
		return why == "", nil
	}
	return false, fmt.Errorf("--to-mode %q is not auto, copy or postcopy: %w", mode, ErrInvalid)
}

// liveSockets returns a fresh pair: the forward's socket here, the one
// HOST's QEMU listens on.
func liveSockets() (local, remote string) {
	var b [6]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	// The pid in the name: ssh leaves its socket behind when this vmfork
	// is killed, and sweepLoaded finds it by that.
	return filepath.Join(os.TempDir(), fwdPrefix+strconv.Itoa(os.Getpid())+"-"+id+".sock"), "/tmp/vmfork-mig-" + id + "/m.sock"
}

// pushDisks pushes template local to HOST as tmp without its RAM and
// device state (they travel by migration): its disk layers, kernel and
// initrd, kept there as a template holding no memory. Its chunk map is
// not written beside the template here: it is not the template's whole.
func (mg *Manager) pushDisks(ctx context.Context, req TransferRequest, local string) (*TransferResult, error) {
	start := time.Now()
	fail := func(err error) (*TransferResult, error) {
		return nil, fmt.Errorf("push %s's disks to %s: %w", local, req.Remote.Dest, err)
	}
	unlock, err := mg.Store.Lock(ctx, local)
	if err != nil {
		return fail(err)
	}
	var once sync.Once
	release := func() { once.Do(unlock) }
	defer release()
	t, err := mg.Store.findTemplate(local)
	if err != nil {
		return fail(err)
	}
	disks := *t
	disks.HasMemory, disks.RAMDelta = false, nil
	disks.Paths.RAM, disks.Paths.DevState = "", ""
	unlockStore, err := mg.Store.chunkStore().lock(false)
	if err != nil {
		return fail(err)
	}
	defer unlockStore()
	m := &chunkManifest{Format: chunkFormat, ChunkSize: chunkSize, Template: disks}
	if m.Host, err = hostFacts(t); err != nil {
		return fail(err)
	}
	tmpDir, err := os.MkdirTemp(filepath.Join(mg.Store.StateDir, dirTemplates), stagingPrefix("export"))
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmpDir)
	files, err := openFiles(ctx, &disks, tmpDir, overlay.FlattenAligned)
	defer func() {
		for _, f := range files {
			f.file.Close()
		}
	}()
	if err == nil && fileExists(filepath.Join(t.Paths.Dir, FileDomainXML)) {
		// The libvirt driver's child on HOST is made from it (openFiles
		// adds it to a template holding memory only).
		var f *os.File
		if f, err = os.Open(filepath.Join(t.Paths.Dir, FileDomainXML)); err == nil {
			files = append(files, archiveFile{Name: archDomainXML, file: f})
		}
	}
	release()
	if err != nil {
		return fail(err)
	}
	cs, buf := mg.Store.chunkStore(), make([]byte, chunkSize)
	for _, af := range files {
		cf, err := cs.cut(ctx, af.file, af.Name, buf)
		if err != nil {
			return fail(fmt.Errorf("chunk %s: %w", af.Name, err))
		}
		m.Files = append(m.Files, *cf)
	}
	m.cutMS = ms(time.Since(start))
	res := &TransferResult{Op: "push", Host: req.Remote.Dest, Name: t.Name, ID: t.ID, CutMS: m.cutMS}
	res.BytesIn, res.BytesOut, err = mg.session(ctx, req, func(ctx context.Context, c *wire) error {
		if err := c.sendJSON(transferHello{Proto: transferProto, Op: "receive", Name: req.Remote.Name}); err != nil {
			return err
		}
		got, err := mg.sendTemplate(ctx, c, m, req.Progress)
		if got != nil {
			res.Received = *got
		}
		return err
	})
	if err != nil {
		return fail(err)
	}
	res.Elapsed = ms(time.Since(start))
	return res, nil
}

// forkToLive is ForkTo's live path, after the freeze: local is the
// template here, tmp its name on HOST.
func (mg *Manager) forkToLive(ctx context.Context, req ForkToRequest, res *ForkToResult, start time.Time, local, tmp string) error {
	lf := mg.Driver.(LiveForker)
	t, err := mg.Store.findTemplate(local)
	if err != nil {
		return err
	}
	// The loaded QEMU starts while the disks travel.
	type loadResult struct {
		lt  LoadedTemplate
		err error
	}
	loadc := make(chan loadResult, 1)
	lctx, cancelLoad := context.WithCancel(ctx)
	defer cancelLoad()
	go func() {
		sweepLoaded()
		dir, err := os.MkdirTemp("", loadedPrefix+strconv.Itoa(os.Getpid())+"-")
		if err != nil {
			loadc <- loadResult{nil, err}
			return
		}
		lt, err := lf.LoadTemplate(lctx, t, dir)
		if err != nil {
			os.RemoveAll(dir)
		}
		loadc <- loadResult{lt, err}
	}()
	var lt LoadedTemplate
	defer func() {
		if lt != nil {
			lt.Close()
		}
	}()
	push := req.Transfer
	push.Remote.Name = tmp
	res.Push, err = mg.pushDisks(ctx, push, local)
	if err != nil {
		cancelLoad() // no use for it: stop its start
	}
	lr := <-loadc
	lt = lr.lt
	if err != nil {
		return err
	}
	res.PushMS = ms(time.Since(start))
	if lr.err != nil {
		return lr.err
	}
	res.LoadedMS = ms(time.Since(start))

	localSock, remoteSock := liveSockets()
	defer os.Remove(localSock)
	var (
		migStarted atomic.Bool
		migErr     error
		migDone    = make(chan struct{})
		mctx       context.Context
		cancel     context.CancelFunc
	)
	mctx, cancel = context.WithCancel(ctx)
	defer cancel()
	remoteStart := time.Now()
	hooks := remoteHooks{
		sshOpts: []string{"-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindUnlink=yes", "-L", localSock + ":" + remoteSock},
		flags:   []string{"--incoming=" + remoteSock},
		onLine: func(line string) error {
			switch line {
			case liveListening:
				if migStarted.Swap(true) {
					return errors.New("the other host said it listens twice")
				}
				go func() {
					defer close(migDone)
					st, err := lt.Migrate(mctx, localSock, req.Migrate, nil)
					res.Migration, migErr = &st, err
				}()
			case liveRunning:
				res.RunningMS = ms(time.Since(start))
			default:
				return fmt.Errorf("unexpected line %q", line)
			}
			return nil
		},
		// The migration must have completed before the commit.
		beforeCommit: func() error {
			select {
			case <-migDone:
			case <-time.After(30 * time.Second):
				return errors.New("the migration did not end after the child's RAM had arrived")
			}
			return migErr
		},
	}
	res.Fork, err = mg.remoteFork(ctx, req, tmp, hooks)
	if err != nil {
		// Where the migration was when the link died says what was lost:
		// "failed" before the switchover (nothing ran there),
		// "postcopy-paused" after it (the child's RAM split: lost).
		status := ""
		if migStarted.Load() {
			select {
			case <-migDone:
				if res.Migration != nil {
					status = res.Migration.Status
				}
			case <-time.After(5 * time.Second):
			}
		}
		cancel()
		if status != "" {
			return fmt.Errorf("%w (migration %s)", err, status)
		}
		return err
	}
	res.RemoteForkMS = ms(time.Since(start))
	// READY there: its identity chain's length after it ran, from this
	// side's RUNNING.
	for _, c := range res.Fork.Children {
		if res.RunningMS == 0 {
			res.RunningMS = ms(remoteStart.Sub(start)) + c.RunningMS
		}
		res.ReadyMS = max(res.ReadyMS, res.RunningMS+c.ReadyMS-c.RunningMS)
	}
	return nil
}

// startIncoming is startChild's live-path case (fork-serve --incoming):
// the child's RAM is its own file, its state arrives by migration. A
// watch kills the child's QEMU if the migration breaks (the link died:
// its RAM is split across the hosts) so that its identity chain, stuck on
// missing pages, fails at once; awaitIncoming waits for the end.
func (mg *Manager) startIncoming(ctx context.Context, c *Machine, tpl *Template, h *incomingHooks) error {
	lf, ok := mg.Driver.(LiveForker)
	if !ok {
		return fmt.Errorf("driver %q has no live path: %w", mg.Driver.Name(), ErrUnsupported)
	}
	def := mg.Store.MachinePaths(c.Name)
	c.Paths.RAM, c.Paths.RAMShared = def.RAM, true
	if err := mg.Store.SaveMachine(c); err != nil {
		return err
	}
	if err := lf.StartIncoming(ctx, c, tpl, h.sock, h.listening); err != nil {
		return err
	}
	if h.running != nil {
		h.running()
	}
	return nil
}

// awaitIncoming waits until child c's RAM has all arrived. A migration
// that breaks (the link died, the other side's QEMU died) kills c's QEMU
// and fails.
func (mg *Manager) awaitIncoming(ctx context.Context, c *Machine) error {
	lf := mg.Driver.(LiveForker)
	for {
		st, err := lf.IncomingStatus(ctx, c)
		switch {
		case err != nil || st == "":
			mg.Driver.Stop(context.WithoutCancel(ctx), c, true)
			return fmt.Errorf("child %s: its QEMU is gone before its RAM arrived: %v", c.Name, err)
		case st == "completed":
			return nil
		case st == "failed" || st == "postcopy-paused" || st == "cancelled":
			// Neither host holds its whole RAM: lost.
			mg.Driver.Stop(context.WithoutCancel(ctx), c, true)
			return fmt.Errorf("child %s: its migration is %s (the link died): the child is lost", c.Name, st)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ForkToOrphanAfter is how long a template kept under a fork --to's name
// (fork-to-<12 hex>) may stay on the host it was pushed to: a fork's
// template lives for the fork's length only (seconds to minutes), and one
// still there an hour after its freeze was left by a fork whose link died
// before either side could give it up (forkto.go:giveUpRemote). `gc` (the
// reaper's Reap) gives it up then, as it gives up an expired one.
const ForkToOrphanAfter = time.Hour

var forkToNameRE = regexp.MustCompile(`^fork-to-[0-9a-f]{12}$`)

// forkToOrphanDeadline is when kept template t, if it is a fork --to's,
// counts as orphaned; zero for any other.
func forkToOrphanDeadline(t *Template) time.Time {
	if !forkToNameRE.MatchString(t.Name) || t.Created.IsZero() {
		return time.Time{}
	}
	return t.Created.Add(ForkToOrphanAfter)
}

// holdForkTo marks kept template name as a running fork --to's for as long
// as this vmfork holds it: a lock file beside the name locks, flocked. A
// vmfork killed mid-fork leaves the file unlocked (the kernel drops the
// lock with the process), and gc gives that template up at once
// (forkToAbandoned) instead of an hour later. release removes the file.
func (s *Store) holdForkTo(name string) (release func(), err error) {
	path := filepath.Join(s.StateDir, dirLocks, name+".sending")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("hold %q: %w", name, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("hold %q: %w", name, err)
	}
	// Removed before the lock goes: gc never finds it unlocked while
	// this fork runs.
	return func() { os.Remove(path); f.Close() }, nil
}

// forkToAbandoned reports whether kept template name was made by a fork
// --to here whose vmfork is gone (holdForkTo's file there, unlocked), and
// removes that file. A name without the file (a template pushed here by
// another host's fork, whose fork-serve gives it up) is not: the hour of
// ForkToOrphanAfter covers it.
func (s *Store) forkToAbandoned(name string) bool {
	if !forkToNameRE.MatchString(name) {
		return false
	}
	path := filepath.Join(s.StateDir, dirLocks, name+".sending")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false // its fork still runs
	}
	os.Remove(path)
	return true
}

// loadedPrefix starts the name of the directory of a live fork's loaded
// QEMU (in the system's temporary directory: its sockets' paths must stay
// short), followed by the pid of the vmfork that made it.
const loadedPrefix = "vmfork-loaded-"

// fwdPrefix starts the name of a live fork's forwarded socket here (ssh
// -L), followed by the pid of the vmfork that made it.
const fwdPrefix = "vmfork-fwd-"

// sweepLoaded removes what live forks whose vmfork is gone (killed
// mid-transfer) left in the temporary directory: their loaded QEMU's
// directory (the QEMU went with vmfork, spawnOptions.dieWithCLI in the
// driver) and the socket ssh forwarded.
func sweepLoaded() {
	for _, prefix := range []string{loadedPrefix, fwdPrefix} {
		sweepDead(prefix)
	}
}

// sweepDead removes the entries of the temporary directory named prefix,
// a pid, "-" and more, whose pid is no running process.
func sweepDead(prefix string) {
	found, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, p := range found {
		pid, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(p), prefix), "-")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 {
			continue // an older vmfork's: no pid to check
		}
		if err := unix.Kill(n, 0); err == nil || errors.Is(err, unix.EPERM) {
			continue // its vmfork still runs
		}
		os.RemoveAll(p)
	}
}
