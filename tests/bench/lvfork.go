package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/libvirtdrv"
	"github.com/vmfork/vmfork/overlay"
)

// The libvirt driver of vmfork, measured next to what libvirt offers for
// the same guest: a source booted through a vmfork Manager on the libvirt
// driver (its own state dir: a record of the other driver would confuse
// the embedded Manager), forked one child per round like the embedded
// source. Its reference is libvirt's own price of starting that child: a
// plain `virsh create --paused` of the child's domain XML under another
// name, on an overlay of its own made before the clock (start hook and
// -incoming defer included, no device state loaded, no resume), as
// BenchmarkForkLibvirt in tests/ measures it.

// libvirtManager returns the run's Manager on the libvirt driver, made on
// first use.
func (e *Env) libvirtManager() (*vmfork.Manager, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lv != nil {
		return e.lv, nil
	}
	if e.cfg.LibvirtURI == "" {
		return nil, fmt.Errorf("libvirt driver: no libvirt URI (--no-libvirt): %w", vmfork.ErrInvalid)
	}
	drv, err := newLibvirtDriver(e.cfg.LibvirtURI, e.log)
	if err != nil {
		return nil, err
	}
	store, err := vmfork.OpenStore(filepath.Join(e.dir, "libvirt-driver"), filepath.Join(e.memDir, "libvirt-driver"))
	if err != nil {
		closeDriver(drv)
		return nil, fmt.Errorf("libvirt driver: %w", err)
	}
	e.lv = vmfork.NewManager(store, drv, e.log)
	return e.lv, nil
}

func closeDriver(d vmfork.Driver) error {
	if c, ok := d.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// checkLibvirtHook fails, before anything boots, unless libvirt's start
// hook runs this vmfork and guest RAM is on a tmpfs: without them a
// libvirt fork child cannot start, and only `vmfork libvirt setup` (which
// changes the host) should make it so.
//
// VMFORK_LIBVIRT_HOOK_BIN names another build of vmfork the hook may run
// instead (the one `vmfork libvirt setup` installed: the product binary,
// not this vmfork-bench), so a run does not re-point a hook that tests of
// that build use at the same time.
func (e *Env) checkLibvirtHook(ctx context.Context) error {
	res, err := libvirtdrv.Setup(ctx, libvirtdrv.SetupOptions{DryRun: true, Binary: os.Getenv("VMFORK_LIBVIRT_HOOK_BIN")})
	if err != nil {
		return fmt.Errorf("libvirt driver: %w", err)
	}
	if res.Changed {
		exe, _ := os.Executable()
		return fmt.Errorf("libvirt driver: this host is not set up for it (would change: %s); run `%s libvirt setup` once, "+
			"or name the vmfork it runs in VMFORK_LIBVIRT_HOOK_BIN, or leave %s out of --methods: %w", strings.Join(res.Changes, "; "), exe, MethodLibvirtDriver, vmfork.ErrInvalid)
	}
	return nil
}

// lvName is a libvirt domain name of the run: host-wide, so it carries the
// run's pid.
func lvName(kind string, mem int) string {
	return fmt.Sprintf("vmfork-bench-%d-%s%d", os.Getpid(), kind, mem)
}

// bootLibvirtSource boots the test guest (with its counter) through the
// libvirt driver and returns it with the time until its agent answered.
func (e *Env) bootLibvirtSource(ctx context.Context, name string, mem int) (*vmfork.Machine, time.Duration, error) {
	lv, err := e.libvirtManager()
	if err != nil {
		return nil, 0, err
	}
	start := time.Now()
	m, err := lv.Boot(ctx, vmfork.BootRequest{Name: name, Spec: e.spec(mem, guestAppend)})
	if err != nil {
		return nil, 0, fmt.Errorf("libvirt driver: boot %s: %w", name, err)
	}
	return m, time.Since(start), nil
}

// removeLibvirt removes machines of the libvirt driver's Manager, by force,
// in the order given (children before their source).
func (e *Env) removeLibvirt(ctx context.Context, names ...string) error {
	var errs []error
	for _, n := range names {
		if err := e.lv.Remove(ctx, n, true); err != nil && !errors.Is(err, vmfork.ErrNotFound) {
			errs = append(errs, fmt.Errorf("libvirt driver: remove %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// forkLibvirt forks one child of src through the libvirt driver and reads
// its memory once it settled.
func (e *Env) forkLibvirt(ctx context.Context, src string) (Sample, string, error) {
	f, err := forkSample(ctx, e.lv, src)
	if err != nil {
		return f.Sample, f.name, err
	}
	s, c, size := f.Sample, f.child, f.size
	s.Phases = identityPhases(c, s.Steps)
	s.AgentMS = c.RunningMS + s.Phases.AgentMS
	pid := c.PID
	if pid <= 0 {
		if pid, err = libvirtPID(c.Name); err != nil {
			return s, c.Name, err
		}
	}
	s, err = e.finishSample(ctx, s, func() (Memory, error) {
		// The child maps its template through the start hook's link in
		// libvirt's RAM directory: count that mapping as its only user's,
		// as for the embedded driver's child.
		return readMemory(pid, guestRAMPath(pid, size), size)
	})
	return s, c.Name, err
}

// createPaused times `virsh create --paused` of the domain XML the libvirt
// driver gives a child of child's template (libvirtdrv.ChildXML), under
// another name, then destroys that domain. The overlay is made before the
// clock. RunningMS holds the time: the domain is started, paused.
func (e *Env) createPaused(ctx context.Context, child, name string) (s Sample, err error) {
	if libvirtSourceXMLFile == "" {
		return s, fmt.Errorf("virsh create --paused: built without libvirt: %w", vmfork.ErrUnsupported)
	}
	rec, err := e.lv.Store.LoadMachine(child)
	if err != nil {
		return s, err
	}
	tpl, err := e.lv.Store.LoadTemplate(rec.Template)
	if err != nil {
		return s, err
	}
	srcXML, err := os.ReadFile(filepath.Join(tpl.Paths.Dir, libvirtSourceXMLFile))
	if err != nil {
		return s, fmt.Errorf("template %s: %w", tpl.ID, err)
	}
	dir, err := os.MkdirTemp(e.dir, "create-")
	if err != nil {
		return s, err
	}
	defer os.RemoveAll(dir)
	// MkdirTemp makes 0700 and vmfork's umask (077) makes the overlay
	// 0600, but libvirt checks that its QEMU user can reach a domain's
	// files before it chowns them (as for createDomain's, ca076da).
	if err := os.Chmod(dir, 0o755); err != nil {
		return s, err
	}
	m := *rec
	m.Name = name
	m.Paths = vmfork.Paths{Dir: dir, Disk: filepath.Join(dir, "disk.qcow2"), Serial: filepath.Join(dir, "serial.log")}
	if tpl.Paths.Disk != "" {
		if err := overlay.Create(ctx, tpl.Paths.Disk, m.Paths.Disk); err != nil {
			return s, err
		}
		if err := os.Chmod(m.Paths.Disk, 0o644); err != nil {
			return s, err
		}
	}
	// The template RAM makes the start hook link it, as for a child. No URI:
	// its release starts no reaper, since no vmfork record names it.
	md := libvirtdrv.Metadata{Machine: name, MachineDir: dir, Template: rec.Template, TemplateRAM: rec.Paths.RAM}
	def, err := libvirtdrv.ChildXML(string(srcXML), &m, md)
	if err != nil {
		return s, fmt.Errorf("child XML of %s: %w", child, err)
	}
	x, err := def.Marshal()
	if err != nil {
		return s, fmt.Errorf("child XML of %s: %w", child, err)
	}
	xmlPath := filepath.Join(dir, "domain.xml")
	if err := os.WriteFile(xmlPath, []byte(x), 0o600); err != nil {
		return s, err
	}
	e.mu.Lock()
	e.domains[name] = true // before create: cleanup must find it whatever happens next
	e.mu.Unlock()
	defer func() { err = errors.Join(err, e.destroyDomain(context.WithoutCancel(ctx), name)) }()
	start := time.Now()
	if _, err := e.virsh(ctx, true, "create", "--paused", xmlPath); err != nil {
		return s, err
	}
	s.RunningMS = ms(time.Since(start))
	return s, nil
}

// libvirtPID reads the pid of a libvirt domain's QEMU from libvirt's pid
// file.
func libvirtPID(name string) (int, error) {
	data, err := os.ReadFile("/run/libvirt/qemu/" + name + ".pid")
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("pid file of %s: %w", name, err)
	}
	return pid, nil
}

// guestRAMPath returns the file a QEMU maps its guest RAM from: the first
// file mapping at least size long. "" when there is none (anonymous RAM).
func guestRAMPath(pid int, size int64) string {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p := ramMapping(sc.Text(), size); p != "" {
			return p
		}
	}
	return ""
}

// ramMapping returns the path of a /proc/PID/maps line if it maps a file at
// least size long.
func ramMapping(line string, size int64) string {
	f := strings.Fields(line)
	if len(f) < 6 || !strings.HasPrefix(f[5], "/") {
		return ""
	}
	lo, hi, _ := strings.Cut(f[0], "-")
	a, err1 := strconv.ParseUint(lo, 16, 64)
	b, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || b <= a || int64(b-a) < size {
		return ""
	}
	return strings.TrimSuffix(strings.Join(f[5:], " "), " (deleted)")
}

// allocatedBytes is how much of a (sparse) file is allocated: for a
// template's RAM, what the freeze copied; 0 when there is no file.
func allocatedBytes(path string) int64 {
	n, _ := overlay.AllocatedBytes(path)
	return n
}
