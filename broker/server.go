package broker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/contract"
)

// Timing defaults.
const (
	// DefaultIdle is how long a broker with no machine registered waits
	// for one before it exits.
	DefaultIdle = 30 * time.Second
	// DefaultPIDPoll is how often the broker looks for machines whose
	// process is gone.
	DefaultPIDPoll = 2 * time.Second
	// controlTimeout bounds one control request, a Register that runs
	// hooks included.
	controlTimeout = 2 * time.Minute
	// maxControlBytes bounds a control request.
	maxControlBytes = 1 << 20
)

var (
	// ErrRunning is returned by Serve when another broker runs for the
	// directory.
	ErrRunning = errors.New("a broker already runs")
	// ErrExiting is returned by Register to a broker that has begun to
	// exit; Client.Register then waits for (or starts) the next one.
	ErrExiting = errors.New("the broker is exiting")
	// ErrNotRunning is returned by calls that need a broker when none
	// answers (and the Client may not start one).
	ErrNotRunning = errors.New("no broker is running")
)

// Config configures a Server.
type Config struct {
	// Dir holds the control socket, the lock, PID and registry files and
	// the CA. It is made 0700.
	Dir string
	// Idle: the broker exits once no machine has been registered for this
	// long (from its start, or from the last Unregister). Default
	// DefaultIdle.
	Idle time.Duration
	// PIDPoll is how often machines' processes are checked (default
	// DefaultPIDPoll).
	PIDPoll time.Duration
	// Proxy configures every machine's proxy.
	Proxy Options
	// Log receives the broker's events (nil: logrus's standard logger).
	Log *logrus.Entry
}

// Server is the broker: one process per state directory that holds every
// registered machine's proxy and values, answering while no vmfork
// command runs. See the package documentation for its life.
type Server struct {
	cfg Config
	ca  *CA
	log *logrus.Entry

	mu       sync.Mutex
	children map[string]*served
	pending  int  // registrations under way: the broker is not idle
	serving  bool // between Serve's start (its registry served again) and its end
	exiting  bool
	idle     *time.Timer
	stop     context.CancelFunc
	handlers sync.WaitGroup
}

// served is a registered machine.
type served struct {
	child Child // with values; Listen is the address really listened on
	proxy *Proxy
	err   error // why it is not served (its listener could not be opened)
}

func (sv *served) close() {
	if sv.proxy != nil {
		sv.proxy.Close()
	}
}

// NewServer makes a broker for cfg.Dir, loading or creating its CA.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("broker: no directory: %w", contract.ErrInvalid)
	}
	if cfg.Idle <= 0 {
		cfg.Idle = DefaultIdle
	}
	if cfg.PIDPoll <= 0 {
		cfg.PIDPoll = DefaultPIDPoll
	}
	if cfg.Log == nil {
		cfg.Log = logrus.NewEntry(logrus.StandardLogger())
	}
	if cfg.Proxy.Log == nil {
		cfg.Proxy.Log = cfg.Log
	}
	ca, err := LoadOrCreateCA(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	return &Server{cfg: cfg, ca: ca, log: cfg.Log, children: map[string]*served{}}, nil
}

// CA returns the broker's CA.
func (s *Server) CA() *CA { return s.ca }

// Serve runs the broker until ctx ends or it has been idle (no machine
// registered) for Config.Idle; both are a normal end, and return nil. It
// returns ErrRunning if another broker runs for the directory.
// It first serves again the machines the registry file lists (a broker
// that died left them), resolving their exec and file values anew; their
// env values are lost until they are registered again. On its way out it
// closes every proxy (machines then see their proxy refuse connections)
// and keeps the registry, so the next broker serves them again.
func (s *Server) Serve(ctx context.Context) error {
	unlock, err := s.lock(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer unlock()
	pidPath := filepath.Join(s.cfg.Dir, PIDFile)
	if err := writeFileAtomic(pidPath, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	defer os.Remove(pidPath)
	ln, err := listenUnix(filepath.Join(s.cfg.Dir, SocketFile))
	if err != nil {
		return fmt.Errorf("broker: control socket: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.stop, s.exiting = cancel, false
	s.mu.Unlock()
	s.reload(ctx)
	s.mu.Lock()
	s.serving = true
	n := len(s.children)
	if n == 0 {
		s.armIdleLocked()
	}
	s.mu.Unlock()
	s.log.WithFields(logrus.Fields{"dir": s.cfg.Dir, "machines": n}).Info("broker started")

	go s.watchPIDs(ctx)
	s.serveControl(ctx, ln)
	left := s.shutdown()
	s.log.WithField("machines", left).Info("broker exits")
	return nil
}

// serveControl answers control requests on ln until ctx ends.
func (s *Server) serveControl(ctx context.Context, ln net.Listener) {
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return
			}
			// Out of descriptors, say: the machines' proxies still run.
			s.log.WithError(err).Warn("control socket: accept failed")
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		s.handlers.Add(1)
		go func() {
			defer s.handlers.Done()
			s.handle(ctx, c)
		}()
	}
}

// shutdown closes every proxy once the control requests under way are
// answered, and returns how many machines were registered. The registry
// stays for the next broker, unless it is empty.
func (s *Server) shutdown() int {
	s.mu.Lock()
	s.exiting = true
	if s.idle != nil {
		s.idle.Stop()
	}
	s.mu.Unlock()
	s.handlers.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	left := len(s.children)
	for _, sv := range s.children {
		sv.close()
	}
	s.children = map[string]*served{}
	s.serving = false
	if left == 0 {
		os.Remove(filepath.Join(s.cfg.Dir, RegistryFile))
	}
	return left
}

// lockWait is how long a starting broker tries for the lock before it
// takes it that another broker runs. A client holds it for an instant to
// learn whether one does (Client.Ensure), or to edit the registry
// (Client.Unregister); a running broker holds it for good.
const lockWait = 500 * time.Millisecond

// lock takes the broker lock for s's directory, or returns ErrRunning.
func (s *Server) lock(ctx context.Context) (unlock func(), err error) {
	deadline := time.Now().Add(lockWait)
	for {
		unlock, ok, err := tryLock(s.cfg.Dir)
		switch {
		case err != nil:
			return nil, err
		case ok:
			return unlock, nil
		case time.Now().After(deadline):
			return nil, ErrRunning
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// armIdleLocked starts the idle countdown (s.mu held).
func (s *Server) armIdleLocked() {
	if s.idle != nil {
		s.idle.Stop()
	}
	s.idle = time.AfterFunc(s.cfg.Idle, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.children) == 0 && s.pending == 0 && !s.exiting && s.stop != nil {
			s.exiting = true
			s.stop()
		}
	})
}

// Register serves child's proxy (opening its listener) and keeps its
// values in memory, replacing an earlier registration of the same
// machine: a registration at the same address keeps its listener and
// open connections and swaps the secrets. Bindings without a Value get an
// exec or file value resolved here. It returns the address really
// listened on.
func (s *Server) Register(ctx context.Context, child Child) (addr Addr, err error) {
	child = child.clone(true)
	if err := child.validate(); err != nil {
		return Addr{}, err
	}
	// While it resolves values (hooks may take seconds) the broker must
	// not go idle under it.
	s.mu.Lock()
	switch {
	case s.exiting:
		s.mu.Unlock()
		return Addr{}, ErrExiting
	case !s.serving:
		s.mu.Unlock()
		return Addr{}, fmt.Errorf("broker: register %q before Serve: %w", child.Name, ErrNotRunning)
	}
	s.pending++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.pending--
		if err != nil && s.exiting {
			err = fmt.Errorf("%w (%w)", ErrExiting, err)
		}
		if len(s.children) == 0 && s.pending == 0 && !s.exiting {
			s.armIdleLocked()
		}
	}()
	if err := s.resolveMissing(ctx, &child); err != nil {
		return Addr{}, err
	}
	return s.install(child)
}

// resolveMissing resolves the exec and file values a registration left
// out.
func (s *Server) resolveMissing(ctx context.Context, child *Child) error {
	for i, b := range child.Secrets {
		if b.Value != nil {
			continue
		}
		if b.source() == "env" {
			return fmt.Errorf("broker: machine %q: secret %s: value_from.env needs its value in the registration: %w",
				child.Name, b.Name, ErrNoValue)
		}
		v, err := Resolve(ctx, b.Name, b.Secret, child.ChildInfo, nil)
		if err != nil {
			return fmt.Errorf("broker: machine %q: %w", child.Name, err)
		}
		child.Secrets[i].Value = v
	}
	return nil
}

// install serves a registration whose values are all there.
func (s *Server) install(child Child) (Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exiting {
		return Addr{}, ErrExiting
	}
	for name, sv := range s.children {
		if name != child.Name && sv.child.Listen == child.Listen {
			// A unix socket would be taken from under the other machine.
			return Addr{}, fmt.Errorf("broker: machine %q: %s is machine %q's: %w", child.Name, child.Listen, name, contract.ErrInvalid)
		}
	}
	old := s.children[child.Name]
	if old != nil && old.proxy != nil && sameListen(old.child.Listen, child.Listen) {
		child.Listen = old.child.Listen
		if err := old.proxy.Update(child); err != nil {
			return Addr{}, err
		}
		old.child = child
	} else {
		if old != nil {
			// Closed first: the new registration may want its address.
			old.close()
			delete(s.children, child.Name)
		}
		sv, err := s.open(child)
		if err != nil {
			s.saveRegistryLocked()
			return Addr{}, err
		}
		s.children[child.Name] = sv
	}
	if s.idle != nil {
		s.idle.Stop()
	}
	s.saveRegistryLocked()
	s.log.WithFields(logrus.Fields{"machine": child.Name, "listen": s.children[child.Name].child.Listen.String(),
		"secrets": len(child.Secrets)}).Info("machine registered")
	return s.children[child.Name].child.Listen, nil
}

// sameListen: a registration at want may keep the listener at have.
func sameListen(have, want Addr) bool {
	if have == want {
		return true
	}
	if have.Network != "tcp" || want.Network != "tcp" {
		return false
	}
	hh, _, err1 := net.SplitHostPort(have.Address)
	wh, wp, err2 := net.SplitHostPort(want.Address)
	return err1 == nil && err2 == nil && wp == "0" && hh == wh
}

// open opens child's listener and starts its proxy.
func (s *Server) open(child Child) (*served, error) {
	ln, err := listenAddr(child.Listen)
	if err != nil {
		return nil, fmt.Errorf("broker: machine %q: listen on %s: %w", child.Name, child.Listen, err)
	}
	child.Listen = Addr{Network: child.Listen.Network, Address: ln.Addr().String()}
	p, err := NewProxy(s.ca, child, s.cfg.Proxy)
	if err != nil {
		ln.Close()
		return nil, err
	}
	go func() {
		if err := p.Serve(ln); err != nil {
			s.log.WithError(err).WithField("machine", child.Name).Warn("proxy stopped")
		}
	}()
	return &served{child: child, proxy: p}, nil
}

// Unregister stops name's proxy, closing its listener and connections,
// and forgets its values. Unknown names are not an error.
func (s *Server) Unregister(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sv, ok := s.children[name]
	if !ok {
		return
	}
	delete(s.children, name)
	sv.close()
	s.saveRegistryLocked()
	s.log.WithField("machine", name).Info("machine unregistered")
	if len(s.children) == 0 && !s.exiting {
		s.armIdleLocked()
	}
}

// Status is a registered machine as List shows it: never a value.
type Status struct {
	ChildInfo
	Listen  Addr           `json:"listen"`
	PID     int            `json:"pid,omitempty"`
	Secrets []SecretStatus `json:"secrets"`
	// Error says why its proxy is not served (its listener could not be
	// opened again after a restart).
	Error string `json:"error,omitempty"`
}

// SecretStatus is one secret of a registered machine.
type SecretStatus struct {
	Name        string   `json:"name"`
	Hosts       []string `json:"hosts"`
	Header      string   `json:"header"`
	Placeholder string   `json:"placeholder"`
	// Source is exec, env or file.
	Source string `json:"source"`
	// HasValue is false for a value lost in a restart: the machine's
	// requests that carry its placeholder are refused until it is
	// registered again with it.
	HasValue bool `json:"has_value"`
}

// List returns the registered machines, sorted by name.
func (s *Server) List() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Status, 0, len(s.children))
	for _, sv := range s.children {
		st := Status{ChildInfo: sv.child.ChildInfo, Listen: sv.child.Listen, PID: sv.child.PID, Secrets: []SecretStatus{}}
		if sv.err != nil {
			st.Error = sv.err.Error()
		}
		for _, b := range sv.child.Secrets {
			st.Secrets = append(st.Secrets, SecretStatus{Name: b.Name, Hosts: slices.Clone(b.Secret.Hosts),
				Header: b.Secret.Header, Placeholder: b.Placeholder, Source: b.source(), HasValue: b.Value != nil})
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// reload serves again what the registry file lists.
func (s *Server) reload(ctx context.Context) {
	children, err := readRegistry(s.cfg.Dir)
	if err != nil {
		s.log.WithError(err).Warn("registry unreadable: no machine served again")
		return
	}
	for _, c := range children {
		log := s.log.WithField("machine", c.Name)
		if err := c.validate(); err != nil {
			log.WithError(err).Warn("registry entry invalid: dropped")
			continue
		}
		for i, b := range c.Secrets {
			if b.source() == "env" {
				log.WithField("secret", b.Name).Warn("value from the environment lost in the restart: refused until the machine is registered again")
				continue
			}
			v, err := Resolve(ctx, b.Name, b.Secret, c.ChildInfo, nil)
			if err != nil {
				log.WithError(err).Warn("value not resolved again: refused until the machine is registered again")
				continue
			}
			c.Secrets[i].Value = v
		}
		sv, err := s.open(c)
		if err != nil {
			log.WithError(err).Warn("machine's proxy not served again")
			sv = &served{child: c, err: err}
		}
		s.mu.Lock()
		s.children[c.Name] = sv
		s.mu.Unlock()
	}
}

// watchPIDs drops machines whose process is gone.
func (s *Server) watchPIDs(ctx context.Context) {
	t := time.NewTicker(s.cfg.PIDPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var gone []string
		s.mu.Lock()
		for name, sv := range s.children {
			if pid := sv.child.PID; pid > 0 && !alive(pid) {
				gone = append(gone, name)
			}
		}
		s.mu.Unlock()
		for _, name := range gone {
			s.log.WithField("machine", name).Info("machine's process is gone")
			s.Unregister(name)
		}
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// saveRegistryLocked writes the registry file (s.mu held). A failure is
// logged: the machines are served all the same, and only a restart would
// miss them.
func (s *Server) saveRegistryLocked() {
	children := make([]Child, 0, len(s.children))
	for _, sv := range s.children {
		children = append(children, sv.child)
	}
	if err := writeRegistry(s.cfg.Dir, children); err != nil {
		s.log.WithError(err).Warn("registry not written: a restarted broker would not serve every machine")
	}
}
