package qemudrv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/internal/brport"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qemustate"
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
)

// freezePrep is what a freeze prepares before pausing the source.
type freezePrep struct {
	topNode string // the source's current top disk node
	next    string // the source's next top overlay, made ahead
	node    string // its block node, added ahead (no backing yet)
	// extras are the extra disks the freeze switches with the boot disk.
	extras  []extraPrep
	cleanup func()
}

// extraPrep is one extra disk a freeze switches (vmfork.TemplateDisk.Frozen).
type extraPrep struct {
	id, topNode, next, node, frozen string
}

func (d *Driver) prepareFreeze(ctx context.Context, mon *qmp.Monitor, src *vmfork.Machine, t *vmfork.Template) (p *freezePrep, err error) {
	p = &freezePrep{cleanup: func() {}}
	if err := qemustate.PrepareSave(ctx, mon); errors.Is(err, qemustate.ErrMigrationBlocked) {
		return nil, fmt.Errorf("%w: %w", err, vmfork.ErrUnsupported)
	} else if err != nil {
		return nil, err
	}
	t.Manifest = manifestOf(src, mon.Greeting())
	if t.VMGenID, err = qmp.QueryVMGenerationID(ctx, mon); err != nil {
		return nil, fmt.Errorf("query vmgenid: %w", err)
	}
	t.Manifest.RAMSharedWithChildren = src.Paths.RAMShared
	if err := d.prepareDisks(ctx, mon, src, t, p); err != nil {
		return nil, err
	}
	return p, nil
}

// prepareDisks makes and opens, while the guest runs, the next top overlay
// of every disk the switch moves (switchDisk), into p; p.cleanup undoes it
// unless the switch happened.
func (d *Driver) prepareDisks(ctx context.Context, mon *qmp.Monitor, src *vmfork.Machine, t *vmfork.Template, p *freezePrep) (err error) {
	if src.Spec.Disk != "" {
		if p.topNode, err = topNode(ctx, mon); err != nil {
			return err
		}
		chain, err := overlay.Chain(src.Paths.Disk)
		if err != nil {
			return err
		}
		if p.next, err = overlay.NextTop(filepath.Dir(src.Paths.Disk)); err != nil {
			return err
		}
		if err := overlay.CreateOn(ctx, t.Paths.Disk, chain[0].Format, chain[0].VirtualSize, p.next); err != nil {
			return err
		}
		// Opening the overlay (blockdev-add) takes 1-2 ms of QEMU's main
		// loop: done here, while the guest runs, the pause only links it
		// in (blockdev-snapshot). With no backing it reads nothing of the
		// frozen image, whose template name does not exist yet.
		p.node = fmt.Sprintf("top%x", time.Now().UnixNano())
		add := map[string]any{
			"driver": "qcow2", "node-name": p.node, "backing": nil,
			"read-only": false, "auto-read-only": false,
			"file": map[string]any{"driver": "file", "filename": p.next, "read-only": false, "auto-read-only": false},
		}
		if err := mon.Execute(ctx, "blockdev-add", add, nil); err != nil {
			os.Remove(p.next)
			return fmt.Errorf("open next overlay: %w", err)
		}
		p.cleanup = func() {
			if src.Paths.Disk != p.next { // not switched: the overlay is unused
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				for _, n := range append([]string{p.node}, p.extraNodes()...) {
					if err := mon.Execute(cctx, "blockdev-del", map[string]any{"node-name": n}, nil); err != nil {
						d.log.WithError(err).WithField("machine", src.Name).Warn("could not close the unused overlay node")
					}
				}
				cancel()
				os.Remove(p.next)
				for _, x := range p.extras {
					os.Remove(x.next)
				}
			}
		}
		if err := prepareExtraDisks(ctx, mon, src, t, p); err != nil {
			p.cleanup()
			return err
		}
	}
	return nil
}

func (p *freezePrep) extraNodes() []string {
	var out []string
	for _, x := range p.extras {
		if x.node != "" {
			out = append(out, x.node)
		}
	}
	return out
}

// prepareExtraDisks makes and opens, before the pause, the next top of
// each extra disk the freeze switches, as prepareFreeze does for the boot
// disk. What it opened is in p.extras for p.cleanup.
func prepareExtraDisks(ctx context.Context, mon *qmp.Monitor, src *vmfork.Machine, t *vmfork.Template, p *freezePrep) error {
	for i, td := range t.Disks {
		if !td.Frozen() {
			continue
		}
		cur := src.Paths.Disks[td.ID].File
		top, err := deviceTopNode(ctx, mon, extraDevice(td.ID))
		if err != nil {
			return fmt.Errorf("disk %q: %w", td.ID, err)
		}
		chain, err := overlay.Chain(cur)
		if err != nil {
			return fmt.Errorf("disk %q: %w", td.ID, err)
		}
		// In the machine's directory: a block device's is /dev.
		next, err := vmfork.NextDiskTop(src.Paths.Dir, td.ID)
		if err != nil {
			return err
		}
		if err := overlay.CreateOn(ctx, td.File, chain[0].Format, chain[0].VirtualSize, next); err != nil {
			return fmt.Errorf("disk %q: %w", td.ID, err)
		}
		x := extraPrep{id: td.ID, topNode: top, next: next, frozen: td.File}
		p.extras = append(p.extras, x)
		// Node names have at most 31 characters.
		node := fmt.Sprintf("x%d-%x", i, time.Now().UnixNano())
		add := map[string]any{
			"driver": "qcow2", "node-name": node, "backing": nil,
			"read-only": false, "auto-read-only": false,
			"file": map[string]any{"driver": "file", "filename": next, "read-only": false, "auto-read-only": false},
		}
		if err := mon.Execute(ctx, "blockdev-add", add, nil); err != nil {
			return fmt.Errorf("disk %q: open next overlay: %w", td.ID, err)
		}
		p.extras[len(p.extras)-1].node = node
	}
	return nil
}

// switchDisk makes the source's current top image the template's frozen
// disk and puts the source on the overlay prepared for it. The frozen image
// gets a second name (a hard link) in the template and keeps its old one:
// QEMU reopens images by the file name it knows (when a node changes between
// read-write and read-only), so no name QEMU has seen may ever point to
// another file. The new top has a new name for the same reason.
func switchDisk(ctx context.Context, mon *qmp.Monitor, src *vmfork.Machine, t *vmfork.Template, p *freezePrep, w *sharedmem.PauseWindow) error {
	if err := os.Link(src.Paths.Disk, t.Paths.Disk); err != nil {
		return err
	}
	w.OnFailure(func(context.Context) error { return os.Remove(t.Paths.Disk) })
	if len(p.extras) == 0 {
		vmfork.Fault(vmfork.FaultFreezeLinked, src.PID)
		if err := mon.Execute(ctx, "blockdev-snapshot", map[string]any{"node": p.topNode, "overlay": p.node}, nil); err != nil {
			return err
		}
	} else {
		// Every disk in one transaction: all switch, or none does.
		actions := []map[string]any{{"type": "blockdev-snapshot", "data": map[string]any{"node": p.topNode, "overlay": p.node}}}
		for _, x := range p.extras {
			cur := src.Paths.Disks[x.id].File
			if cur == x.frozen {
				// A block device, frozen where it is (TemplateDisk.Foreign):
				// no second name, it is read-only once switched.
				actions = append(actions, map[string]any{"type": "blockdev-snapshot", "data": map[string]any{"node": x.topNode, "overlay": x.node}})
				continue
			}
			if err := os.Link(cur, x.frozen); err != nil {
				return fmt.Errorf("disk %q: %w", x.id, err)
			}
			w.OnFailure(func(context.Context) error { return os.Remove(x.frozen) })
			actions = append(actions, map[string]any{"type": "blockdev-snapshot", "data": map[string]any{"node": x.topNode, "overlay": x.node}})
		}
		vmfork.Fault(vmfork.FaultFreezeLinked, src.PID)
		if err := mon.Execute(ctx, "transaction", map[string]any{"actions": actions}, nil); err != nil {
			return err
		}
	}
	// From here the source writes to its new overlays, on top of the
	// frozen disks; that cannot be undone, and need not be: only cont
	// remains.
	src.Paths.Disk = p.next
	for _, x := range p.extras {
		src.Paths.Disks[x.id] = vmfork.DiskFile{File: x.next}
	}
	w.Keep()
	return nil
}

// topNode returns the node name of the top image of the machine's disk.
func topNode(ctx context.Context, mon *qmp.Monitor) (string, error) {
	return deviceTopNode(ctx, mon, "disk0")
}

// deviceTopNode returns the node name of the top image of disk device id.
func deviceTopNode(ctx context.Context, mon *qmp.Monitor, id string) (string, error) {
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
		if strings.Contains(b.QDev, "/"+id+"/") && b.Inserted != nil {
			return b.Inserted.NodeName, nil
		}
	}
	return "", fmt.Errorf("query disks: no %s found", id)
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

var (
	_ vmfork.Pooler         = (*Driver)(nil)
	_ vmfork.InPlaceStarter = (*Driver)(nil)
)

// StartInPlace implements vmfork.InPlaceStarter. A machine of this driver
// is its directory and its process, so a new process in the same
// directory is started the way any child is.
func (d *Driver) StartInPlace(ctx context.Context, m *vmfork.Machine, t *vmfork.Template) error {
	return d.StartChild(ctx, m, t)
}

// Prestart implements vmfork.Pooler: the part of StartChild that does not
// depend on the fork, up to a QEMU waiting for its device state with
// x-ignore-shared set. On error no process of m is left.
func (d *Driver) Prestart(ctx context.Context, m *vmfork.Machine, t *vmfork.Template) (err error) {
	if !t.HasMemory {
		return fmt.Errorf("template %q holds no memory: %w", t.ID, vmfork.ErrInvalid)
	}
	bin, err := d.qemuBinary()
	if err != nil {
		return err
	}
	if err := vmfork.PickPorts(m.Spec.Ports); err != nil {
		return err
	}
	am, start, err := childRAM(m, t)
	if err != nil {
		return err
	}
	p, err := d.spawnMachine(ctx, bin, am, ArgvOptions{Incoming: true, DevicesOnly: t.Manifest.DevStateFormat != ""})
	if err != nil {
		if start != "" {
			os.Remove(start)
		}
		return err
	}
	m.PID = p.pid
	defer func() {
		if err != nil {
			p.kill()
			m.PID = 0
			if start != "" { // mapTemplate removes it once reached
				os.Remove(start)
			}
		}
	}()
	mon, err := dialQMP(ctx, m.Paths.QMP, p, m.Paths.Log, d.log.WithField("machine", m.Name))
	if err != nil {
		return err
	}
	defer mon.Close()
	vmfork.TraceChildPhase(ctx, m.Name, vmfork.PhaseQMPReady)
	got := manifestOf(m, mon.Greeting())
	got.RAMSharedWithChildren, got.DevStateBytes = t.Manifest.RAMSharedWithChildren, t.Manifest.DevStateBytes
	got.DevStateFormat = t.Manifest.DevStateFormat
	if err := got.Check(t.Manifest); err != nil {
		return err
	}
	if err := mapTemplate(ctx, mon, p.pid, start, t, int64(m.Spec.MemoryMiB)<<20, d.log.WithField("machine", m.Name)); err != nil {
		return err
	}
	// Capabilities are global to the QEMU process and outlive this
	// connection; the device-state fd is passed in Complete, because QEMU
	// keeps getfd descriptors per monitor connection state.
	return qemustate.SetIgnoreShared(ctx, mon)
}

// Complete implements vmfork.Pooler: it loads the device state into a
// prestarted m, keeps its link down and lets it run. On error m's process
// is killed.
func (d *Driver) Complete(ctx context.Context, m *vmfork.Machine, t *vmfork.Template) (err error) {
	defer func() {
		if err != nil && d.procs.alive(m.PID, m.Paths.QMP) {
			d.procs.signal(m.PID, syscall.SIGKILL)
		}
	}()
	log := d.log.WithField("machine", m.Name)
	mon, err := qmp.Dial(ctx, m.Paths.QMP, qmp.WithLogger(log))
	if err != nil {
		return fmt.Errorf("connect to QMP: %w", err)
	}
	defer mon.Close()
	// The one round of RARP frames QEMU sends as the load ends (Argv:
	// migration.announce-rounds) must not leave this host. The VM is
	// paused then, so QEMU queues them at the backend and delivers them at
	// cont; a backend whose link is down drops them on delivery. So the
	// backend's link goes down before the load and stays down until
	// SetLink raises it with the NIC's. (The NIC's own link would not do:
	// the load sets it to the source's.)
	link := linkName(m)
	if link == netdevID {
		if err := mon.SetLink(ctx, netdevID, false); err != nil {
			return fmt.Errorf("set backend link down: %w", err)
		}
	}
	if err := qemustate.LoadDeviceState(ctx, mon, devStateFD, t.Paths.DevState, migrationPoll, log); err != nil {
		// A QEMU that rejects the stream exits: its log says why.
		time.Sleep(100 * time.Millisecond)
		if !d.procs.alive(m.PID, m.Paths.QMP) {
			return fmt.Errorf("load device state: %w", exitError(nil, m.Paths.Log))
		}
		return fmt.Errorf("load device state: %w", err)
	}
	vmfork.TraceChildPhase(ctx, m.Name, vmfork.PhaseStateLoaded)
	// The child wakes with its source's MAC and addresses: keep it off the
	// network until its identity chain has run (vmfork.LinkSetter). The
	// guest's announcement that the virtio-net announce timer asks for at
	// the first instant it runs goes out on this downed link, and so
	// nowhere: QEMU drops what a NIC whose link is down sends.
	if err := mon.SetLink(ctx, link, false); err != nil {
		return fmt.Errorf("set link down: %w", err)
	}
	if err := mon.Cont(ctx); err != nil {
		return fmt.Errorf("resume child: %w", err)
	}
	return nil
}

// dialQMP connects to a QEMU that is starting: its socket appears a little
// after the process. It gives up when QEMU exits or ctx ends.
func dialQMP(ctx context.Context, path string, p *process, logPath string, log *logrus.Entry) (*qmp.Monitor, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		mon, err := qmp.Dial(actx, path, qmp.WithLogger(log))
		cancel()
		if err == nil {
			privateSockets(filepath.Dir(path))
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
	if !d.procs.alive(m.PID, m.Paths.QMP) {
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

// SetLink implements vmfork.LinkSetter. A link goes up once the tap that
// this process made for m forwards on its bridge (internal/brport).
func (d *Driver) SetLink(ctx context.Context, m *vmfork.Machine, up bool) error {
	if tap, ok := d.taps.Load(m.Name); ok && up {
		if w := brport.WaitForwarding(ctx, tap.(string)); w > 0 {
			d.log.WithFields(logrus.Fields{"machine": m.Name, "tap": tap, "waited_ms": w.Milliseconds()}).Debug("the tap's bridge port forwards")
		}
	}
	mon, err := qmp.Dial(ctx, m.Paths.QMP)
	if err != nil {
		return fmt.Errorf("set link: %w", err)
	}
	defer mon.Close()
	if err := mon.SetLink(ctx, linkName(m), up); err != nil {
		return fmt.Errorf("set link: %w", err)
	}
	return nil
}

// linkName is what set_link switches for m: its backend when it has one
// (QEMU then switches the NIC's link with it, and the backend drops what
// QEMU queued for it while the link was down: Complete), else its NIC.
func linkName(m *vmfork.Machine) string {
	if netdevArg(m.Spec) != "" {
		return netdevID
	}
	return nicID
}
