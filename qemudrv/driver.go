package qemudrv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/egress"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/profile"
	"github.com/vmfork/vmfork/qmp"
)

// Name is the driver's name in machine records.
const Name = "qemu"

// Driver runs machines as QEMU processes on this host.
type Driver struct {
	log *logrus.Entry
	// QEMU is the QEMU binary to run (a name looked up on PATH, or a
	// path); empty means qemu-system-x86_64. The CLI sets it from --qemu.
	QEMU string
	// StopGrace is how long Stop waits for the guest to power off after an
	// ACPI power-button press before it makes QEMU quit.
	StopGrace time.Duration
	// AgentTimeout bounds connecting to a guest agent that should answer.
	AgentTimeout time.Duration
	// BootTimeout bounds the wait for a starting guest's agent when the
	// caller's context has no deadline of its own (the CLI's --timeout
	// gives it one, and then that is the bound).
	BootTimeout time.Duration
	procs       procs
	// egress enforces fork contracts (contract.go): the host's own
	// network namespace.
	egress egress.Host
	// taps maps the name of a machine this process started on a bridge to
	// its tap's (SetLink waits for the tap's port, internal/brport).
	taps sync.Map
}

// DefaultBootTimeout is long enough for a distribution guest to boot under
// TCG on a loaded host (the busybox test guest takes seconds), and bounds a
// guest that will never answer: one whose kernel panics and reboots, one
// without an agent.
const DefaultBootTimeout = 5 * time.Minute

var _ vmfork.Driver = (*Driver)(nil)

// New returns a Driver that logs to log (nil discards).
func New(log *logrus.Entry) *Driver {
	if log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		log = logrus.NewEntry(l)
	}
	return &Driver{log: log.WithField("driver", Name), StopGrace: 10 * time.Second, AgentTimeout: 10 * time.Second, BootTimeout: DefaultBootTimeout, procs: realProcs()}
}

// Name implements vmfork.Driver.
func (d *Driver) Name() string { return Name }

// Start implements vmfork.Driver.
func (d *Driver) Start(ctx context.Context, m *vmfork.Machine) error {
	bin, err := d.qemuBinary()
	if err != nil {
		return err
	}
	if err := d.CheckNetwork(ctx, m); err != nil {
		return err
	}
	if err := d.resolve(ctx, bin, m); err != nil {
		return err
	}
	if m.Spec.Disk != "" {
		if _, err := os.Stat(m.Paths.Disk); errors.Is(err, fs.ErrNotExist) {
			if err := overlay.Create(ctx, m.Spec.Disk, m.Paths.Disk); err != nil {
				return fmt.Errorf("create disk overlay: %w", err)
			}
		}
	}
	if err := vmfork.PrepareDisks(ctx, m); err != nil {
		return err
	}
	if m.Paths.RAMShared {
		// A machine's own RAM file starts empty; QEMU sizes it. A file left
		// by an earlier run would hand the guest stale memory.
		if err := os.Remove(m.Paths.RAM); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove stale RAM file: %w", err)
		}
	}
	p, err := d.spawnMachine(ctx, bin, m, ArgvOptions{})
	if err != nil {
		return err
	}
	m.PID = p.pid
	d.log.WithFields(logrus.Fields{"machine": m.Name, "pid": p.pid, "accel": m.Accel}).Debug("QEMU started")
	if err := d.waitAgent(ctx, m, p); err != nil {
		p.kill()
		m.PID = 0
		return err
	}
	return nil
}

// resolve fills in what the record leaves to the host: accelerator, versioned
// machine type, CPU model, MAC and free host ports. Fields already set (a
// fork child's inherited configuration) are kept.
func (d *Driver) resolve(ctx context.Context, bin string, m *vmfork.Machine) error {
	if m.Accel == "" {
		accel, err := profile.ChooseAccel(d.log.WithField("machine", m.Name))
		if err != nil {
			return err
		}
		m.Accel = accel
	}
	if m.Spec.MachineType == "" {
		// QEMU's own list: this driver runs the binary it asks.
		mt, err := resolveMachineType(ctx, bin)
		if err != nil {
			return err
		}
		m.Spec.MachineType = mt
	}
	return m.Spec.FillProfile()
}

// waitAgent waits until the guest agent answers, QEMU exits, or the wait's
// bound ends: ctx's deadline, or BootTimeout when ctx has none. A guest that
// never answers fails with the last lines of its serial console, which
// usually say why (a kernel panic, a missing root file system).
func (d *Driver) waitAgent(ctx context.Context, m *vmfork.Machine, p *process) error {
	start := time.Now()
	var cancel context.CancelFunc
	if _, ok := ctx.Deadline(); !ok && d.BootTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, d.BootTimeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		// Each attempt re-sends the sync request: bytes written before the
		// agent opened its port may have been lost.
		actx, acancel := context.WithTimeout(ctx, 3*time.Second)
		a, err := qmp.DialAgent(actx, m.Paths.QGA)
		acancel()
		if err == nil {
			a.Close()
			privateSockets(filepath.Dir(m.Paths.QGA))
			return nil
		}
		select {
		case <-p.done:
			return exitError(p.err, m.Paths.Log)
		default:
		}
		if ctx.Err() != nil {
			msg := fmt.Sprintf("guest agent of %q did not answer within %v", m.Name, time.Since(start).Round(time.Second))
			if tail := consoleTail(m.Paths.Serial, 5); tail != "" {
				msg += "; last serial console lines: " + tail
			} else {
				msg += "; the serial console is empty"
			}
			return fmt.Errorf("%s: %w", msg, ctx.Err())
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// consoleTail returns the last n non-empty lines of a serial console log,
// joined into one line, each cut to 160 printable characters.
func consoleTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(data) > 64<<10 {
		data = data[len(data)-64<<10:]
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(strings.Map(func(r rune) rune {
			if r < 0x20 || r == 0x7f || r == utf8.RuneError {
				return -1
			}
			return r
		}, l))
		if len(l) > 160 {
			l = l[:160] + "..."
		}
		if l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Status implements vmfork.Driver. It looks at the process only, never at QMP,
// so it does not queue behind another command holding the monitor.
func (d *Driver) Status(ctx context.Context, m *vmfork.Machine) (vmfork.State, error) {
	if d.procs.alive(m.PID, m.Paths.QMP) {
		if m.State == vmfork.StatePaused {
			return vmfork.StatePaused, nil
		}
		return vmfork.StateRunning, nil
	}
	return vmfork.StateStopped, nil
}

// Agent implements vmfork.Driver.
func (d *Driver) Agent(ctx context.Context, m *vmfork.Machine) (*qmp.Agent, error) {
	if !d.procs.alive(m.PID, m.Paths.QMP) {
		return nil, fmt.Errorf("machine %q: %w", m.Name, vmfork.ErrNotRunning)
	}
	actx, cancel := context.WithTimeout(ctx, d.AgentTimeout)
	defer cancel()
	a, err := qmp.DialAgent(actx, m.Paths.QGA, qmp.WithLogger(d.log.WithField("machine", m.Name)))
	if err != nil {
		return nil, fmt.Errorf("guest agent of %q does not answer: %w", m.Name, err)
	}
	return a, nil
}

// Stop implements vmfork.Driver: a shutdown request through the guest agent
// (or the ACPI power button when no agent answers), a bounded wait, QMP quit,
// then SIGKILL. With force it kills at once.
func (d *Driver) Stop(ctx context.Context, m *vmfork.Machine, force bool) error {
	defer d.removeRuntimeFiles(m)
	if !d.procs.alive(m.PID, m.Paths.QMP) {
		return nil
	}
	log := d.log.WithField("machine", m.Name)
	if !force {
		d.flushDisks(ctx, m)
		if err := d.agentShutdown(ctx, m); err == nil {
			return nil
		} else {
			log.WithError(err).Debug("no clean shutdown through the guest agent")
		}
		if err := d.qmpStop(ctx, m, "system_powerdown", d.StopGrace); err == nil {
			return nil
		} else {
			log.WithError(err).Debug("no clean power-off")
		}
		if err := d.qmpStop(ctx, m, "quit", d.procs.quitGrace); err == nil {
			return nil
		} else {
			log.WithError(err).Debug("QMP quit did not end QEMU")
		}
	}
	if err := d.procs.signal(m.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill QEMU (pid %d): %w", m.PID, err)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.procs.killGrace)
	defer cancel()
	if err := d.procs.waitGone(wctx, m.PID, m.Paths.QMP); err != nil {
		return fmt.Errorf("QEMU (pid %d) survived SIGKILL: %w", m.PID, err)
	}
	return nil
}

// agentShutdown asks the guest agent to power the guest off and waits up to
// StopGrace for QEMU to exit.
func (d *Driver) agentShutdown(ctx context.Context, m *vmfork.Machine) error {
	ctx, cancel := context.WithTimeout(ctx, d.StopGrace)
	defer cancel()
	a, err := d.Agent(ctx, m)
	if err != nil {
		return err
	}
	defer a.Close()
	// qemu-ga sends no reply to guest-shutdown when it succeeds.
	sctx, scancel := context.WithTimeout(ctx, time.Second)
	err = a.Execute(sctx, "guest-shutdown", map[string]string{"mode": "powerdown"}, nil)
	scancel()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, qmp.ErrClosed) {
		return err
	}
	return d.procs.waitGone(ctx, m.PID, m.Paths.QMP)
}

// flushDisks makes QEMU write out what it holds of m's disks, by stopping
// its vCPUs (vm_stop flushes every block device) and letting them run on.
// QEMU's exit path flushes too, but only a QEMU that gets there: QEMU 7.2
// loaded with migration.announce-rounds=0 segfaulted at the guest's
// virtio-net reset during its power-off (fixed: Argv, announceRounds), and
// the qcow2 metadata of writes the guest made but did not flush was lost.
// Kept as a cheap guard (a few ms) against any crash on that path.
// Best effort: a machine that cannot be paused is stopped as before.
func (d *Driver) flushDisks(ctx context.Context, m *vmfork.Machine) {
	ctx, cancel := context.WithTimeout(ctx, d.StopGrace)
	defer cancel()
	mon, err := qmp.Dial(ctx, m.Paths.QMP)
	if err == nil {
		defer mon.Close()
		if err = mon.Stop(ctx); err == nil {
			err = mon.Cont(ctx)
		}
	}
	if err != nil {
		d.log.WithField("machine", m.Name).WithError(err).Warn("disks not flushed before the stop")
	}
}

// qmpStop sends cmd over QMP and waits up to grace for QEMU to exit.
func (d *Driver) qmpStop(ctx context.Context, m *vmfork.Machine, cmd string, grace time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	mon, err := qmp.Dial(ctx, m.Paths.QMP)
	if err != nil {
		return err
	}
	defer mon.Close()
	if err := mon.Execute(ctx, cmd, nil, nil); err != nil && !errors.Is(err, qmp.ErrClosed) {
		return err
	}
	return d.procs.waitGone(ctx, m.PID, m.Paths.QMP)
}

// removeRuntimeFiles removes what only a running QEMU needs: sockets left by
// a killed process and the machine's own RAM file (its contents mean nothing
// once the guest is off). A template's RAM file is never touched here.
func (d *Driver) removeRuntimeFiles(m *vmfork.Machine) {
	if d.procs.alive(m.PID, m.Paths.QMP) {
		return
	}
	d.removeEgress(m)
	for _, p := range []string{m.Paths.QMP, m.Paths.QGA} {
		os.Remove(p)
	}
	if m.Paths.RAMShared {
		os.Remove(m.Paths.RAM)
	}
	if m.Paths.Disk != "" {
		overlay.RemoveOldTops(m.Paths.Dir, m.Paths.Disk)
	}
	vmfork.RemoveOldDiskTops(m)
}

var _ vmfork.MultiDisker = (*Driver)(nil)

// DiskPolicies implements vmfork.MultiDisker: the embedded driver honours
// every policy.
func (d *Driver) DiskPolicies() []vmfork.DiskPolicy {
	return []vmfork.DiskPolicy{vmfork.DiskCow, vmfork.DiskShared, vmfork.DiskFresh, vmfork.DiskKeep}
}

// BootsDisks implements vmfork.MultiDisker.
func (d *Driver) BootsDisks() bool { return true }

// BlockDisks implements vmfork.BlockDisker: extra disks on block devices
// are opened with host_device.
func (d *Driver) BlockDisks() bool { return true }
