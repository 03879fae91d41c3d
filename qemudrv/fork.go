package qemudrv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/sharedmem"
)

var _ vmfork.Forker = (*Driver)(nil)

const (
	// devStateFD is the name under which the device-state file is handed to
	// QEMU (getfd), so that QEMU runs no shell (exec:) and opens no path.
	devStateFD = "vmfork-devstate"
	// migrationPoll is how often query-migrate is asked while the (small)
	// device state streams; the whole save or load takes tens of ms.
	migrationPoll = 2 * time.Millisecond
	// rollbackTimeout bounds undoing a failed freeze, even after a cancel.
	rollbackTimeout = 10 * time.Second
)

var xIgnoreShared = []qmp.Capability{{Name: qmp.CapXIgnoreShared, State: true}}

// Freeze implements vmfork.Forker. Everything that can be prepared or checked
// is done before the source is paused; the pause covers only stop, the disk
// switch, the device-state save, the RAM copy and cont.
func (d *Driver) Freeze(ctx context.Context, src *vmfork.Machine, t *vmfork.Template) (fr vmfork.FreezeResult, err error) {
	if !alive(src.PID, src.Paths.QMP) {
		return fr, fmt.Errorf("machine %q: %w", src.Name, vmfork.ErrNotRunning)
	}
	mon, err := qmp.Dial(ctx, src.Paths.QMP, qmp.WithLogger(d.log.WithField("machine", src.Name)))
	if err != nil {
		return fr, fmt.Errorf("connect to QMP: %w", err)
	}
	defer mon.Close()
	prep, err := d.prepareFreeze(ctx, mon, src, t)
	if err != nil {
		return fr, err
	}
	defer prep.cleanup()

	start := time.Now()
	if err := mon.Stop(ctx); err != nil {
		return fr, fmt.Errorf("pause: %w", err)
	}
	// undo holds one step per completed change, run in reverse on error. Its
	// first step resumes the source: a source is never left paused.
	undo := []func(context.Context) error{mon.Cont}
	defer func() {
		if err == nil {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](rctx); uerr != nil {
				if i == 0 {
					err = fmt.Errorf("%w; resuming failed too: %v: %w", err, uerr, vmfork.ErrStillPaused)
				} else {
					err = fmt.Errorf("%w; rollback: %v", err, uerr)
				}
			}
		}
	}()
	if src.Spec.Disk != "" {
		if err := switchDisk(ctx, mon, src, t, prep, &undo); err != nil {
			return fr, fmt.Errorf("switch disk: %w", err)
		}
	}
	if err := mon.Migrate(ctx, "fd:"+devStateFD); err != nil {
		return fr, fmt.Errorf("save device state: %w", err)
	}
	if _, err := mon.WaitMigration(ctx, migrationPoll); err != nil {
		return fr, fmt.Errorf("save device state: %w", err)
	}
	if src.Paths.RAMShared {
		st, err := sharedmem.Freeze(ctx, src.Paths.RAM, t.Paths.RAM)
		if err != nil {
			return fr, err
		}
		fr.RAMCopiedBytes = st.CopiedBytes
	} else if err := sharedmem.CreateEmpty(t.Paths.RAM, int64(src.Spec.MemoryMiB)<<20); err != nil {
		// A fork child's RAM is private, so the device state above carried
		// all of it; the template's RAM file only has to exist.
		return fr, err
	}
	if err := mon.Cont(ctx); err != nil {
		return fr, fmt.Errorf("resume: %w: %w", err, vmfork.ErrStillPaused)
	}
	undo = nil
	fr.Pause = time.Since(start)
	if st, err := os.Stat(t.Paths.DevState); err == nil {
		t.Manifest.DevStateBytes = st.Size()
	}
	d.log.WithFields(logrus.Fields{"machine": src.Name, "template": t.ID, "pause": fr.Pause}).Debug("frozen")
	return fr, nil
}

// freezePrep is what a freeze prepares before pausing the source.
type freezePrep struct {
	topNode string // the source's current top disk node
	next    string // the source's next top overlay, made ahead
	cleanup func()
}

func (d *Driver) prepareFreeze(ctx context.Context, mon *qmp.Monitor, src *vmfork.Machine, t *vmfork.Template) (p *freezePrep, err error) {
	p = &freezePrep{cleanup: func() {}}
	info, err := mon.QueryMigrate(ctx)
	if err != nil {
		return nil, fmt.Errorf("query migration: %w", err)
	}
	if len(info.BlockedReasons) > 0 {
		return nil, fmt.Errorf("QEMU refuses to save this machine's state: %s (detach such devices before forking): %w",
			strings.Join(info.BlockedReasons, "; "), vmfork.ErrUnsupported)
	}
	if err := mon.MigrateSetCapabilities(ctx, xIgnoreShared); err != nil {
		return nil, fmt.Errorf("set %s: %w", qmp.CapXIgnoreShared, err)
	}
	t.Manifest = manifestOf(src, mon.Greeting())
	if t.VMGenID, err = mon.QueryVMGenerationID(ctx); err != nil {
		return nil, fmt.Errorf("query vmgenid: %w", err)
	}
	t.Manifest.RAMSharedWithChildren = src.Paths.RAMShared
	if src.Spec.Disk != "" {
		if p.topNode, err = topNode(ctx, mon); err != nil {
			return nil, err
		}
		chain, err := overlay.Chain(src.Paths.Disk)
		if err != nil {
			return nil, err
		}
		if p.next, err = nextTopPath(src); err != nil {
			return nil, err
		}
		if err := overlay.CreateOn(ctx, t.Paths.Disk, chain[0].Format, chain[0].VirtualSize, p.next); err != nil {
			return nil, err
		}
		p.cleanup = func() {
			if src.Paths.Disk != p.next { // not switched: the overlay is unused
				os.Remove(p.next)
			}
		}
	}
	f, err := os.OpenFile(t.Paths.DevState, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		p.cleanup()
		return nil, fmt.Errorf("create device-state file: %w", err)
	}
	defer f.Close()
	if err := mon.GetFD(ctx, devStateFD, f); err != nil {
		p.cleanup()
		return nil, fmt.Errorf("pass device-state file: %w", err)
	}
	prev := p.cleanup
	p.cleanup = func() {
		prev()
		// Harmless when migrate already took the fd.
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		mon.CloseFD(cctx, devStateFD)
	}
	return p, nil
}

// switchDisk makes the source's current top image the template's frozen
// disk and puts the source on the overlay prepared for it. The frozen image
// gets a second name (a hard link) in the template and keeps its old one:
// QEMU reopens images by the file name it knows (when a node changes between
// read-write and read-only), so no name QEMU has seen may ever point to
// another file. The new top has a new name for the same reason.
func switchDisk(ctx context.Context, mon *qmp.Monitor, src *vmfork.Machine, t *vmfork.Template, p *freezePrep, undo *[]func(context.Context) error) error {
	if err := os.Link(src.Paths.Disk, t.Paths.Disk); err != nil {
		return err
	}
	*undo = append(*undo, func(context.Context) error { return os.Remove(t.Paths.Disk) })
	node := fmt.Sprintf("top%x", time.Now().UnixNano())
	add := map[string]any{
		"driver": "qcow2", "node-name": node, "backing": nil,
		"read-only": false, "auto-read-only": false,
		"file": map[string]any{"driver": "file", "filename": p.next, "read-only": false, "auto-read-only": false},
	}
	if err := mon.Execute(ctx, "blockdev-add", add, nil); err != nil {
		return err
	}
	*undo = append(*undo, func(ctx context.Context) error {
		return mon.Execute(ctx, "blockdev-del", map[string]any{"node-name": node}, nil)
	})
	if err := mon.Execute(ctx, "blockdev-snapshot", map[string]any{"node": p.topNode, "overlay": node}, nil); err != nil {
		return err
	}
	// From here the source writes to its new overlay, on top of the frozen
	// disk; that cannot be undone, and need not be: only cont remains.
	src.Paths.Disk = p.next
	*undo = (*undo)[:1]
	return nil
}

// nextTopPath names the overlay a source moves to at its next fork:
// disk.qcow2, disk.1.qcow2, disk.2.qcow2, ... in the machine's directory.
func nextTopPath(m *vmfork.Machine) (string, error) {
	dir := filepath.Dir(m.Paths.Disk)
	for n := 1; n < 1<<20; n++ {
		p := filepath.Join(dir, fmt.Sprintf("disk.%d.qcow2", n))
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			return p, nil
		}
	}
	return "", fmt.Errorf("no free overlay name in %s", dir)
}

// topNode returns the node name of the top image of the machine's disk.
func topNode(ctx context.Context, mon *qmp.Monitor) (string, error) {
	var blocks []struct {
		QDev     string `json:"qdev"`
		Inserted *struct {
			NodeName string `json:"node-name"`
		} `json:"inserted"`
	}
	if err := mon.Execute(ctx, "query-block", nil, &blocks); err != nil {
		return "", fmt.Errorf("query disks: %w", err)
	}
	for _, b := range blocks {
		if strings.Contains(b.QDev, "/disk0/") && b.Inserted != nil {
			return b.Inserted.NodeName, nil
		}
	}
	return "", fmt.Errorf("query disks: no disk0 found")
}

func manifestOf(m *vmfork.Machine, g qmp.Greeting) vmfork.Manifest {
	v := g.Version.QEMU
	return vmfork.Manifest{
		QEMUVersion: fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro),
		MachineType: m.Spec.MachineType,
		CPUModel:    m.Spec.CPUModel,
		MemoryMiB:   m.Spec.MemoryMiB,
		CPUs:        m.Spec.CPUs,
		Devices:     GuestVisible(Argv(m, ArgvOptions{})),
	}
}

// StartChild implements vmfork.Forker: QEMU with the template's device
// configuration and -incoming defer, RAM mapped share=off from the template,
// then x-ignore-shared, the device state through a passed fd, and cont once
// the load has completed (never before: 7.2 would activate the disk early).
func (d *Driver) StartChild(ctx context.Context, child *vmfork.Machine, t *vmfork.Template) error {
	if err := d.Prestart(ctx, child, t); err != nil {
		return err
	}
	return d.Complete(ctx, child, t)
}

var _ vmfork.Pooler = (*Driver)(nil)

// Prestart implements vmfork.Pooler: the part of StartChild that does not
// depend on the fork, up to a QEMU waiting for its device state with
// x-ignore-shared set. On error no process of m is left.
func (d *Driver) Prestart(ctx context.Context, m *vmfork.Machine, t *vmfork.Template) (err error) {
	if !t.HasMemory {
		return fmt.Errorf("template %q holds no memory: %w", t.ID, vmfork.ErrInvalid)
	}
	bin, err := qemuBinary()
	if err != nil {
		return err
	}
	if err := pickPorts(m.Spec.Ports); err != nil {
		return err
	}
	p, err := spawn(bin, Argv(m, ArgvOptions{Incoming: true}), m.Paths.Log)
	if err != nil {
		return err
	}
	m.PID = p.pid
	defer func() {
		if err != nil {
			p.kill()
			m.PID = 0
		}
	}()
	mon, err := dialQMP(ctx, m.Paths.QMP, p, m.Paths.Log, d.log.WithField("machine", m.Name))
	if err != nil {
		return err
	}
	defer mon.Close()
	got := manifestOf(m, mon.Greeting())
	got.RAMSharedWithChildren, got.DevStateBytes = t.Manifest.RAMSharedWithChildren, t.Manifest.DevStateBytes
	if err := got.Check(t.Manifest); err != nil {
		return err
	}
	// Capabilities are global to the QEMU process and outlive this
	// connection; the device-state fd is passed in Complete, because QEMU
	// keeps getfd descriptors per monitor connection state.
	if err := mon.MigrateSetCapabilities(ctx, xIgnoreShared); err != nil {
		return fmt.Errorf("set %s: %w", qmp.CapXIgnoreShared, err)
	}
	return nil
}

// Complete implements vmfork.Pooler: it loads the device state into a
// prestarted m, keeps its link down and lets it run. On error m's process
// is killed.
func (d *Driver) Complete(ctx context.Context, m *vmfork.Machine, t *vmfork.Template) (err error) {
	defer func() {
		if err != nil && alive(m.PID, m.Paths.QMP) {
			syscall.Kill(m.PID, syscall.SIGKILL)
		}
	}()
	mon, err := qmp.Dial(ctx, m.Paths.QMP, qmp.WithLogger(d.log.WithField("machine", m.Name)))
	if err != nil {
		return fmt.Errorf("connect to QMP: %w", err)
	}
	defer mon.Close()
	if err := d.loadDeviceState(ctx, mon, t); err != nil {
		// A QEMU that rejects the stream exits: its log says why.
		time.Sleep(100 * time.Millisecond)
		if !alive(m.PID, m.Paths.QMP) {
			return fmt.Errorf("load device state: %w", exitError(nil, m.Paths.Log))
		}
		return fmt.Errorf("load device state: %w", err)
	}
	// The child wakes with its source's MAC and addresses: keep it off the
	// network until its identity chain has run (vmfork.LinkSetter).
	if err := mon.SetLink(ctx, nicID, false); err != nil {
		return fmt.Errorf("set link down: %w", err)
	}
	if err := mon.Cont(ctx); err != nil {
		return fmt.Errorf("resume child: %w", err)
	}
	return nil
}

func (d *Driver) loadDeviceState(ctx context.Context, mon *qmp.Monitor, t *vmfork.Template) error {
	f, err := os.Open(t.Paths.DevState)
	if err != nil {
		return err
	}
	err = mon.GetFD(ctx, devStateFD, f)
	f.Close()
	if err != nil {
		return err
	}
	if err := mon.MigrateIncoming(ctx, "fd:"+devStateFD); err != nil {
		return err
	}
	_, err = mon.WaitMigration(ctx, migrationPoll)
	return err
}

// dialQMP connects to a QEMU that is starting: its socket appears a little
// after the process. It gives up when QEMU exits or ctx ends.
func dialQMP(ctx context.Context, path string, p *process, logPath string, log *logrus.Entry) (*qmp.Monitor, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		mon, err := qmp.Dial(actx, path, qmp.WithLogger(log))
		cancel()
		if err == nil {
			return mon, nil
		}
		select {
		case <-p.done:
			return nil, exitError(p.err, logPath)
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to QMP: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(time.Millisecond):
			// A failed connect(2) costs microseconds; polling every
			// millisecond keeps this wait at QEMU's own start time.
		}
	}
}

// Resume implements vmfork.Forker.
func (d *Driver) Resume(ctx context.Context, m *vmfork.Machine) error {
	if !alive(m.PID, m.Paths.QMP) {
		return nil
	}
	mon, err := qmp.Dial(ctx, m.Paths.QMP)
	if err != nil {
		return err
	}
	defer mon.Close()
	st, err := mon.QueryStatus(ctx)
	if err != nil {
		return err
	}
	if st.Running {
		return nil
	}
	if err := mon.Cont(ctx); err != nil && !errors.Is(err, qmp.ErrClosed) {
		return err
	}
	return nil
}

var _ vmfork.LinkSetter = (*Driver)(nil)

// SetLink implements vmfork.LinkSetter.
func (d *Driver) SetLink(ctx context.Context, m *vmfork.Machine, up bool) error {
	mon, err := qmp.Dial(ctx, m.Paths.QMP)
	if err != nil {
		return fmt.Errorf("set link: %w", err)
	}
	defer mon.Close()
	if err := mon.SetLink(ctx, nicID, up); err != nil {
		return fmt.Errorf("set link: %w", err)
	}
	return nil
}
