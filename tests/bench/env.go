package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/internal/proc"
	"github.com/vmfork/vmfork/qemudrv"
)

// Config says where the test guest is and where reports go.
type Config struct {
	// GuestDir holds the built test guest: vmlinuz, initrd.gz, data.qcow2
	// (make guest), or the Debian guest: vmlinuz, initrd.img, root.qcow2 and
	// its variants file (make guest-debian).
	GuestDir string
	// GuestVariant names the Debian guest's variant (its kernel command
	// line); empty is the first in its variants file.
	GuestVariant string
	// LibvirtURI is the libvirt connection for the save/restore comparator
	// (e.g. qemu:///system); empty leaves libvirt out.
	LibvirtURI string
	// Settle is how long a child runs after it answered before its memory
	// is read: every comparator's child is read at the same age.
	Settle time.Duration
	// Progress, if set, is told about each step of a long run.
	Progress func(Progress)
	// Log receives vmfork's own log lines (nil discards them).
	Log   io.Writer
	Debug bool
}

// Progress is one step of a run: Done of Total steps are finished.
type Progress struct {
	Done, Total int
	Step        string
}

// guestAppend is the kernel command line of the machines of a run. The
// counter (a process writing a number every 0.2 s) makes a source a guest
// with something running, as a user's would; idleAppend leaves it out.
const (
	idleAppend  = "console=ttyS0 quiet panic=-1"
	guestAppend = idleAppend + " vmfork.counter=1"
)

// Guest is the test guest's files.
type Guest struct {
	Kernel string `json:"kernel"`
	Initrd string `json:"initrd"`
	Disk   string `json:"disk"`
	// Append is the guest's own kernel command line (the Debian guest's
	// variant); empty means the busybox guest's, chosen per machine.
	Append string `json:"append,omitempty"`
}

// Env is one benchmark run's world: its own vmfork state dir and mem dir, a
// Manager driving the embedded QEMU driver in-process, and a record of
// everything the run started. Close removes all of it, also after a failure
// or a cancel.
type Env struct {
	cfg    Config
	guest  Guest
	dir    string // state dir and libvirt files below it
	memDir string
	mgr    *vmfork.Manager
	log    *logrus.Entry
	events *forkEvents
	host   Host

	mu      sync.Mutex
	pids    map[int]string  // QEMU processes the harness spawned itself → a marker in their argv
	domains map[string]bool // libvirt domains by name
	lv      *vmfork.Manager // on the libvirt driver, when a method uses it
	steps   Progress
}

// NewEnv prepares a run. The caller must Close it.
func NewEnv(ctx context.Context, cfg Config) (*Env, error) {
	g, err := guestFiles(cfg.GuestDir, cfg.GuestVariant)
	if err != nil {
		return nil, err
	}
	for _, p := range []string{g.Kernel, g.Initrd, g.Disk} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("guest dir %q must be absolute: %w", cfg.GuestDir, vmfork.ErrInvalid)
		}
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("test guest not built (make guest): %w: %w", err, vmfork.ErrInvalid)
		}
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 2 * time.Second
	}
	// On disk, not tmpfs: only guest RAM belongs in memory. World-readable so
	// that libvirt's QEMU (user libvirt-qemu) can reach its files below it.
	// VMFORK_BENCH_TMP and VMFORK_BENCH_SHM move both (the smoke tests give
	// each run dirs of its own, so that runs side by side cannot mix).
	dir, err := os.MkdirTemp(envOr("VMFORK_BENCH_TMP", "/var/tmp"), "vmfork-bench-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	memDir, err := os.MkdirTemp(envOr("VMFORK_BENCH_SHM", "/dev/shm"), "vmfork-bench-")
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("bench: %w", err)
	}
	e := &Env{cfg: cfg, guest: g, dir: dir, memDir: memDir, pids: map[int]string{}, domains: map[string]bool{}}
	if err := os.Chmod(dir, 0o755); err != nil {
		e.Close(ctx)
		return nil, fmt.Errorf("bench: %w", err)
	}
	store, err := vmfork.OpenStore(filepath.Join(dir, "state"), memDir)
	if err != nil {
		e.Close(ctx)
		return nil, fmt.Errorf("bench: %w", err)
	}
	l := logrus.New()
	l.SetOutput(io.Discard)
	e.events = &forkEvents{}
	e.events.reset(nil)
	level := logrus.InfoLevel
	if cfg.Debug {
		level = logrus.DebugLevel
	}
	l.SetLevel(level)
	if cfg.Log != nil {
		l.AddHook(writerHook{w: cfg.Log, level: level, f: &logrus.TextFormatter{DisableTimestamp: true}})
	}
	log := logrus.NewEntry(l)
	e.log = log
	e.mgr = vmfork.NewManager(store, qemudrv.New(log), log)
	e.host = describeHost(ctx, cfg.LibvirtURI)
	return e, nil
}

// Host describes the machine a run measured.
func (e *Env) Host() Host { return e.host }

// Close stops everything the run started and removes its files. It runs to
// the end even when ctx is already cancelled (Ctrl-C), bounded in time.
func (e *Env) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	var errs []error
	e.mu.Lock()
	domains := make([]string, 0, len(e.domains))
	for d := range e.domains {
		domains = append(domains, d)
	}
	pids := make(map[int]string, len(e.pids))
	for p, m := range e.pids {
		pids[p] = m
	}
	lv := e.lv
	e.mu.Unlock()
	if lv != nil {
		// Through the driver first: it destroys its domains and forgets them
		// cleanly, children before their sources (their templates go with
		// their last child).
		ms, _ := lv.Store.ListMachines()
		for i := len(ms) - 1; i >= 0; i-- {
			if err := lv.Remove(ctx, ms[i].Name, true); err != nil && !errors.Is(err, vmfork.ErrNotFound) {
				errs = append(errs, err)
			}
		}
		errs = append(errs, closeDriver(lv.Driver))
	}
	for _, d := range domains {
		errs = append(errs, e.destroyDomain(ctx, d))
	}
	for pid, marker := range pids {
		errs = append(errs, killOwned(pid, marker))
	}
	if e.mgr != nil {
		ms, _ := e.mgr.Store.ListMachines()
		// Children before their sources, so templates go as early as they can.
		for i := len(ms) - 1; i >= 0; i-- {
			if err := e.mgr.Remove(ctx, ms[i].Name, true); err != nil && !errors.Is(err, vmfork.ErrNotFound) {
				errs = append(errs, err)
			}
		}
		// A QEMU whose record never got its PID (a start cut short) still
		// names our state dir in its argv, which no other process does.
		for _, pid := range processesMentioning(e.dir, e.memDir) {
			errs = append(errs, killOwned(pid, e.dir))
		}
	}
	errs = append(errs, os.RemoveAll(e.dir), os.RemoveAll(e.memDir))
	return errors.Join(errs...)
}

// track records a QEMU the harness spawned itself.
func (e *Env) track(pid int, marker string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pids[pid] = marker
}

func (e *Env) untrack(pid int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.pids, pid)
}

// killOwned SIGKILLs pid if it still runs with marker in its argv (so a
// recycled PID is never hit) and waits until it is gone.
func killOwned(pid int, marker string) error {
	if !proc.Alive(pid, marker) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill pid %d: %w", pid, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := proc.WaitGone(ctx, pid, marker); err != nil {
		return fmt.Errorf("pid %d survived SIGKILL: %w", pid, err)
	}
	return nil
}

// processesMentioning lists QEMU processes whose argv contains one of the
// run's own (unique, temporary) directories.
func processesMentioning(dirs ...string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + ent.Name() + "/cmdline")
		if err != nil {
			continue
		}
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		if !bytes.Contains(argv0, []byte("qemu-system")) {
			continue
		}
		for _, d := range dirs {
			if bytes.Contains(cmdline, []byte(d)) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// guestFiles finds the guest in dir: the Debian guest where its variants
// file is, else the busybox guest.
func guestFiles(dir, variant string) (Guest, error) {
	// The Debian guest's build directory, not the links through its current:
	// a rebuild switches current, and an overlay names its backing by path.
	if build, err := filepath.EvalSymlinks(filepath.Join(dir, "current")); err == nil {
		dir = build
	}
	variants, err := os.ReadFile(filepath.Join(dir, "variants"))
	if errors.Is(err, fs.ErrNotExist) {
		if variant != "" {
			return Guest{}, fmt.Errorf("guest variant %q: %s is not the Debian guest (no variants file): %w", variant, dir, vmfork.ErrInvalid)
		}
		return Guest{
			Kernel: filepath.Join(dir, "vmlinuz"),
			Initrd: filepath.Join(dir, "initrd.gz"),
			Disk:   filepath.Join(dir, "data.qcow2"),
		}, nil
	}
	if err != nil {
		return Guest{}, fmt.Errorf("Debian guest in %s: %w", dir, err)
	}
	g := Guest{
		Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.img"),
		Disk:   filepath.Join(dir, "root.qcow2"),
	}
	var names []string
	for _, line := range strings.Split(string(variants), "\n") {
		name, cmdline, ok := strings.Cut(line, "\t")
		if !ok {
			continue
		}
		if variant == "" || name == variant {
			g.Append = cmdline
			return g, nil
		}
		names = append(names, name)
	}
	return Guest{}, fmt.Errorf("Debian guest in %s has no variant %q (has %s): %w", dir, variant, strings.Join(names, ", "), vmfork.ErrInvalid)
}

// cmdline is the kernel command line of a machine of the run: the Debian
// guest's own, or busybox (idleAppend, guestAppend) for the busybox guest,
// whose init reads the counter switch.
func (e *Env) cmdline(busybox string) string {
	if e.guest.Append != "" {
		return e.guest.Append
	}
	return busybox
}

// spec is the test guest at memMiB of RAM with the kernel command line cmdline
// (the busybox guest's; see Env.cmdline).
func (e *Env) spec(memMiB int, cmdline string) vmfork.Spec {
	return vmfork.Spec{
		Kernel: e.guest.Kernel, Initrd: e.guest.Initrd, Append: e.cmdline(cmdline), Disk: e.guest.Disk,
		MemoryMiB: memMiB, CPUs: 1,
	}
}

// boot boots the test guest (with its counter) as name and returns it with
// the time until its guest agent answered.
func (e *Env) boot(ctx context.Context, name string, memMiB int) (*vmfork.Machine, time.Duration, error) {
	return e.bootWith(ctx, name, memMiB, guestAppend)
}

func (e *Env) bootWith(ctx context.Context, name string, memMiB int, cmdline string) (*vmfork.Machine, time.Duration, error) {
	start := time.Now()
	m, err := e.mgr.Boot(ctx, vmfork.BootRequest{Name: name, Spec: e.spec(memMiB, cmdline)})
	if err != nil {
		return nil, 0, err
	}
	if e.host.Accel == "" {
		e.host.Accel = m.Accel
	}
	return m, time.Since(start), nil
}

// remove removes a vmfork machine, by force: the run has no use for a clean
// guest shutdown.
func (e *Env) remove(ctx context.Context, names ...string) error {
	var errs []error
	for _, n := range names {
		// A failed child may be gone already: vmfork removes it.
		if err := e.mgr.Remove(ctx, n, true); !errors.Is(err, vmfork.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// settle lets a child run for the configured time before its memory is read.
func (e *Env) settle(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(e.cfg.Settle):
		return nil
	}
}

// begin starts counting total steps; step reports one finished.
func (e *Env) begin(total int) {
	e.mu.Lock()
	e.steps = Progress{Total: total}
	e.mu.Unlock()
}

func (e *Env) step(format string, args ...any) {
	e.mu.Lock()
	e.steps.Done = min(e.steps.Done+1, e.steps.Total)
	e.steps.Step = fmt.Sprintf(format, args...)
	p := e.steps
	e.mu.Unlock()
	if e.cfg.Progress != nil {
		e.cfg.Progress(p)
	}
}

// announce reports what runs now without counting a step.
func (e *Env) announce(format string, args ...any) {
	e.mu.Lock()
	e.steps.Step = fmt.Sprintf(format, args...)
	p := e.steps
	e.mu.Unlock()
	if e.cfg.Progress != nil {
		e.cfg.Progress(p)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// envOr returns the environment variable name, or def when it is unset.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
