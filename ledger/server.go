package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Files in a ledger directory (besides families/, log.go).
const (
	// FileControl is the control socket (mode 0600) vmfork commands use.
	FileControl = "control.sock"
	// FileLock is held (flock) by the one server of the directory, or by a
	// Client that opens the Store itself while no server runs.
	FileLock = "server.lock"
	// FilePID holds the running server's PID.
	FilePID = "server.pid"
	// FileMachines is the server's own copy of its registrations (used on
	// restart only when it has no DiscoverFunc).
	FileMachines = "machines.json"
)

// Machine is a machine the server serves: its name (the holder its claims
// carry), its family, and the unix socket its QEMU listens on for the
// ledger port (chardev socket,server=on,wait=off). All three come from the
// host.
type Machine struct {
	Name   string `json:"name"`
	Family string `json:"family"`
	Socket string `json:"socket"`
}

func (m Machine) check() error {
	if err := errors.Join(CheckName(m.Name), CheckFamily(m.Family)); err != nil {
		return err
	}
	if !filepath.IsAbs(m.Socket) {
		return fmt.Errorf("machine %q: socket %q is not an absolute path: %w", m.Name, m.Socket, ErrInvalid)
	}
	return nil
}

// MachineStatus is a served machine and whether its socket is connected.
type MachineStatus struct {
	Machine
	Connected bool `json:"connected"`
	// Since is when it was attached, connected or disconnected last.
	Since time.Time `json:"since"`
}

// DiscoverFunc returns the machines that run now, with their families and
// sockets: what a server that starts (or restarts after a crash) serves.
type DiscoverFunc func(ctx context.Context) ([]Machine, error)

// Server defaults.
const (
	// DefaultIdleExit: a server with no machine for this long exits.
	DefaultIdleExit = time.Minute
	// DefaultDropAfter: a machine whose socket cannot be connected to for
	// this long is dropped (its QEMU is gone and nobody detached it).
	DefaultDropAfter = time.Minute
	// DefaultLockWait: how long a starting server waits for the lock.
	DefaultLockWait = 10 * time.Second
)

// ServerOptions configures a Server.
type ServerOptions struct {
	// Dir is the ledger directory (vmfork: <state-dir>/ledger).
	Dir string
	// Discover finds the running machines when the server starts and
	// before it exits idle. When set, it is the truth on start and
	// FileMachines is not read. Nil: the server starts with FileMachines.
	Discover DiscoverFunc
	Log      *logrus.Entry
	Limits   Limits
	// Rate bounds each machine's requests (zero: DefaultRate).
	Rate Rate
	// IdleExit: exit after this long with no machine (0: DefaultIdleExit;
	// negative: never).
	IdleExit time.Duration
	// DropAfter (0: DefaultDropAfter).
	DropAfter time.Duration
	// LockWait (0: DefaultLockWait).
	LockWait time.Duration

	// dial connects to a machine's socket (tests wrap the connection).
	dial func(ctx context.Context, path string) (net.Conn, error)
}

// Server serves the ledger port of every registered machine: it connects
// to each machine's socket as a client, serves the stream as that
// machine's session, and reconnects when the stream ends (QEMU restarted
// the socket) until the machine is detached or its socket has been
// unreachable for DropAfter. It answers the control socket, and exits
// after IdleExit with no machine.
type Server struct {
	opts  ServerOptions
	log   *logrus.Entry
	store *Store
	ready chan struct{}

	mu         sync.Mutex
	machines   map[string]*attachment
	closing    bool
	emptySince time.Time
	wg         sync.WaitGroup // machine loops
}

type attachment struct {
	Machine
	quit chan struct{}
	kick chan struct{}
	done chan struct{} // closed when serveMachine has closed its stream
	// Guarded by Server.mu.
	connected bool
	since     time.Time
}

// NewServer makes a server; Run serves.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("ledger server: no directory: %w", ErrInvalid)
	}
	if opts.Log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		opts.Log = logrus.NewEntry(l)
	}
	if opts.IdleExit == 0 {
		opts.IdleExit = DefaultIdleExit
	}
	if opts.DropAfter <= 0 {
		opts.DropAfter = DefaultDropAfter
	}
	if opts.LockWait <= 0 {
		opts.LockWait = DefaultLockWait
	}
	if opts.dial == nil {
		opts.dial = func(ctx context.Context, path string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	}
	return &Server{opts: opts, log: opts.Log, ready: make(chan struct{}), machines: map[string]*attachment{}}, nil
}

// Ready is closed once Run holds the lock and answers the control socket.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Run takes the directory's lock, serves until ctx ends or the server has
// been idle for IdleExit, and returns nil then. It returns ErrRunning
// when another server holds the lock and answers.
func (s *Server) Run(ctx context.Context) (err error) {
	if err := os.MkdirAll(s.opts.Dir, 0o700); err != nil {
		return fmt.Errorf("ledger server: %w", err)
	}
	unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	pidPath := filepath.Join(s.opts.Dir, FilePID)
	if err := os.WriteFile(pidPath, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		return fmt.Errorf("ledger server: %w", err)
	}
	defer os.Remove(pidPath)
	if s.store, err = OpenStore(s.opts.Dir, StoreOptions{Limits: s.opts.Limits, Log: s.log}); err != nil {
		return err
	}
	defer s.store.Close()
	ln, err := listenControl(filepath.Join(s.opts.Dir, FileControl))
	if err != nil {
		return err
	}
	var handlers sync.WaitGroup
	accepting := make(chan struct{})
	defer func() {
		// New registrations are refused from here, then the socket goes,
		// then the machines: only then the lock, so a server started
		// meanwhile begins with everything this one wrote on disk.
		s.mu.Lock()
		s.closing = true
		for name, a := range s.machines {
			// Not saved: a server started later serves them again.
			delete(s.machines, name)
			close(a.quit)
		}
		s.mu.Unlock()
		ln.Close()
		<-accepting // no handler starts after this
		handlers.Wait()
		s.wg.Wait()
	}()
	s.start(ctx)
	go func() {
		defer close(accepting)
		s.accept(ln, &handlers)
	}()
	s.log.WithField("pid", os.Getpid()).Info("ledger server started")
	close(s.ready)
	tick := time.NewTicker(s.tick())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.log.Info("ledger server stopped")
			return nil
		case <-tick.C:
			s.store.Sweep(time.Minute, s.hasFamily)
			if s.idle(ctx) {
				s.log.Info("no machine left: ledger server exits")
				return nil
			}
		}
	}
}

func (s *Server) tick() time.Duration {
	if s.opts.IdleExit > 0 && s.opts.IdleExit < 2*time.Second {
		return s.opts.IdleExit / 2
	}
	return time.Second
}

// lock takes FileLock, waiting up to LockWait for a server that is
// exiting (or a Client using the Store) to let go of it.
func (s *Server) lock(ctx context.Context) (func(), error) {
	deadline := time.Now().Add(s.opts.LockWait)
	c := &Client{Dir: s.opts.Dir}
	for {
		unlock, ok, err := tryLock(s.opts.Dir)
		if err != nil || ok {
			return unlock, err
		}
		if c.Ping(ctx) == nil {
			return nil, ErrRunning
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("ledger server: %s is held by a process that does not answer on %s", FileLock, FileControl)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tryLock takes FileLock without waiting; ok is false when it is held.
func tryLock(dir string) (unlock func(), ok bool, err error) {
	f, err := os.OpenFile(filepath.Join(dir, FileLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("ledger lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("ledger lock: %w", err)
	}
	return func() { f.Close() }, true, nil
}

// start attaches the machines that run now: Discover's, or the saved
// registrations.
func (s *Server) start(ctx context.Context) {
	var ms []Machine
	var err error
	if s.opts.Discover != nil {
		ms, err = s.opts.Discover(ctx)
	} else {
		ms, err = loadMachines(s.opts.Dir)
	}
	if err != nil {
		s.log.WithError(err).Warn("ledger server: finding the running machines failed")
	}
	for _, m := range ms {
		if err := s.Attach(m); err != nil {
			s.log.WithError(err).WithField("machine", m.Name).Warn("ledger server: cannot serve machine")
		}
	}
	s.mu.Lock()
	s.save()
	s.mu.Unlock()
}

// idle says whether the server should exit: no machine for IdleExit, and
// none found by one more Discover (a machine whose registration missed a
// server that was exiting). From true on, registrations are refused.
func (s *Server) idle(ctx context.Context) bool {
	if s.opts.IdleExit < 0 {
		return false
	}
	s.mu.Lock()
	if len(s.machines) > 0 {
		s.emptySince = time.Time{}
	} else if s.emptySince.IsZero() {
		s.emptySince = time.Now()
	}
	due := len(s.machines) == 0 && time.Since(s.emptySince) >= s.opts.IdleExit
	s.mu.Unlock()
	if !due {
		return false
	}
	if s.opts.Discover != nil {
		if ms, err := s.opts.Discover(ctx); err == nil {
			for _, m := range ms {
				s.Attach(m)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.machines) > 0 {
		s.emptySince = time.Time{}
		return false
	}
	s.closing = true
	return true
}

// errClosing answers a registration that reaches a server on its way out;
// the Client then starts another.
var errClosing = errors.New("ledger server is exiting")

// Attach serves machine m from now on. Attaching a machine again with
// the same family and socket is a no-op that retries its connection at
// once (the caller has just started its QEMU); with another family or
// socket, the old stream is closed and the new one served.
func (s *Server) Attach(m Machine) error {
	if err := m.check(); err != nil {
		return err
	}
	s.mu.Lock()
	var old *attachment
	// The replaced stream is closed before Attach returns (outside the
	// lock: serveMachine takes it on its way out).
	defer func() {
		s.mu.Unlock()
		if old != nil {
			<-old.done
		}
	}()
	if s.closing || s.store == nil {
		return errClosing
	}
	if a := s.machines[m.Name]; a != nil {
		if a.Machine == m {
			select {
			case a.kick <- struct{}{}:
			default:
			}
			return nil
		}
		close(a.quit)
		old = a
	}
	a := &attachment{Machine: m, quit: make(chan struct{}), kick: make(chan struct{}, 1), done: make(chan struct{}), since: time.Now()}
	s.machines[m.Name] = a
	s.emptySince = time.Time{}
	s.wg.Add(1)
	go s.serveMachine(a)
	s.save()
	return nil
}

// Detach stops serving machine name (its stream is closed); detaching a
// machine that is not served is a no-op. A server on its way out refuses
// (the Client then edits the saved registrations once it is gone).
func (s *Server) Detach(name string) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return errClosing
	}
	a := s.machines[name]
	if a != nil {
		delete(s.machines, name)
		close(a.quit)
		s.save()
	}
	s.mu.Unlock()
	// The stream is closed when Detach returns: a caller that detaches a
	// machine before it goes (stop, rm) must not race its last answers.
	if a != nil {
		<-a.done
	}
	return nil
}

// Machines returns the machines served, sorted by name.
func (s *Server) Machines() []MachineStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]MachineStatus, 0, len(s.machines))
	for _, a := range s.machines {
		out = append(out, MachineStatus{Machine: a.Machine, Connected: a.connected, Since: a.since})
	}
	slices.SortFunc(out, func(a, b MachineStatus) int { return compare(a.Name, b.Name) })
	return out
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (s *Server) hasFamily(family string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.machines {
		if a.Family == family {
			return true
		}
	}
	return false
}

func (s *Server) setConnected(a *attachment, c bool) {
	s.mu.Lock()
	a.connected, a.since = c, time.Now()
	s.mu.Unlock()
}

// serveMachine connects to a machine's socket and serves it, again after
// each disconnection, until the machine is detached or dropped.
func (s *Server) serveMachine(a *attachment) {
	defer s.wg.Done()
	defer close(a.done)
	log := s.log.WithFields(logrus.Fields{"machine": a.Name, "family": a.Family})
	sess := &session{store: s.store, family: a.Family, machine: a.Name, bucket: newBucket(s.opts.Rate), now: time.Now, log: log}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-a.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	down, backoff := time.Now(), 10*time.Millisecond
	for ctx.Err() == nil {
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := s.opts.dial(dctx, a.Socket)
		dcancel()
		if err != nil {
			if time.Since(down) > s.opts.DropAfter {
				s.drop(a, err, log)
				return
			}
			select {
			case <-ctx.Done():
			case <-a.kick:
				backoff = 10 * time.Millisecond
			case <-time.After(backoff):
				backoff = min(2*backoff, time.Second)
			}
			continue
		}
		s.setConnected(a, true)
		log.Debug("ledger port connected")
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		err = sess.serve(conn)
		stop()
		conn.Close()
		s.setConnected(a, false)
		down, backoff = time.Now(), 10*time.Millisecond
		if ctx.Err() == nil {
			log.WithError(err).Debug("ledger port disconnected; reconnecting")
		}
	}
}

// drop forgets a machine whose socket stayed unreachable.
func (s *Server) drop(a *attachment, err error, log *logrus.Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.machines[a.Name] == a {
		delete(s.machines, a.Name)
		s.save()
		log.WithError(err).Info("ledger port unreachable: machine dropped")
	}
}

// save writes the registrations to FileMachines (under s.mu), atomically.
// They matter only to a server restarted with no DiscoverFunc.
func (s *Server) save() {
	ms := make([]Machine, 0, len(s.machines))
	for _, a := range s.machines {
		ms = append(ms, a.Machine)
	}
	if err := saveMachines(s.opts.Dir, ms); err != nil {
		s.log.WithError(err).Warn("ledger server: cannot save its machines")
	}
}

func saveMachines(dir string, ms []Machine) error {
	slices.SortFunc(ms, func(a, b Machine) int { return compare(a.Name, b.Name) })
	js, err := json.MarshalIndent(ms, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, FileMachines+".tmp")
	if err := os.WriteFile(tmp, append(js, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, FileMachines))
}

func loadMachines(dir string) ([]Machine, error) {
	js, err := os.ReadFile(filepath.Join(dir, FileMachines))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ms []Machine
	if err := json.Unmarshal(js, &ms); err != nil {
		return nil, fmt.Errorf("%s: %w", FileMachines, err)
	}
	return ms, nil
}
