package vmfork

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmfork/vmfork/overlay"
)

// Block-device disks. An extra disk whose file= is a block device (a loop
// device, an LVM volume, a partition) is written in place until the
// machine's first fork: then the device becomes the frozen, read-only base
// (TemplateDisk.Foreign: it stays where it is, it is not copied), and the
// source and every child write to qcow2 overlays in the state dir. The
// device is never written again until CommitDisk puts the source's
// overlay back onto it, once no child or template reads it any more.

// BlockDisksDoc is where the docs say what forking a block disk means, and
// why network disks are refused (docs/ARCHITECTURE.md).
const BlockDisksDoc = `docs/ARCHITECTURE.md "Block-device disks"`

// Fault points of disk commit (fault.go, the crash matrix).
const (
	// FaultDiskCommitted: qemu-img commit has written a block disk's
	// overlays onto its device; the machine's record still names the top
	// overlay.
	FaultDiskCommitted = "disk.committed"
	// FaultDiskRecorded: the record names the device again; the
	// committed top overlay is not removed yet.
	FaultDiskRecorded = "disk.recorded"
)

// networkDiskPrefixes are QEMU's network block protocols as a file name
// gives them (rbd:pool/image, iscsi://..., nbd:host:port, ...).
var networkDiskPrefixes = []string{"rbd:", "iscsi:", "nbd:", "nbd+", "gluster:", "gluster+", "sheepdog:", "ssh:", "http:", "https:", "ftp:", "ftps:", "nfs:", "vxhs:"}

// refuseNetworkDisk refuses a disk on a network block protocol: vmfork
// forks images it can freeze and stack overlays on here; a network volume
// has its own copy-on-write (an RBD clone, an iSCSI target's snapshot),
// which is on paper only (BlockDisksDoc).
func refuseNetworkDisk(what, path string) error {
	lower := strings.ToLower(path)
	for _, p := range networkDiskPrefixes {
		if strings.HasPrefix(lower, p) {
			return fmt.Errorf("%s %q is a network disk (%s): vmfork forks file and block-device disks only, see %s: %w",
				what, path, strings.TrimRight(p, ":+"), BlockDisksDoc, ErrInvalid)
		}
	}
	if strings.Contains(path, "://") {
		return fmt.Errorf("%s %q is a URL: vmfork forks file and block-device disks only, see %s: %w", what, path, BlockDisksDoc, ErrInvalid)
	}
	return nil
}

// checkDiskFile checks an extra disk's file: an absolute path to a regular
// file or a block device, not a network disk.
func checkDiskFile(what, path string) error {
	if err := refuseNetworkDisk(what, path); err != nil {
		return err
	}
	if filepath.IsAbs(path) && overlay.IsBlockDevice(path) {
		f, err := os.OpenFile(path, os.O_RDONLY, 0)
		if err != nil {
			return fmt.Errorf("%s: block device: %w", what, asInvalid(err))
		}
		return f.Close()
	}
	return checkImageFile(what, path)
}

// checkBootDiskNotBlock refuses a block device as the boot disk: the boot
// disk always runs on an overlay made at boot (its base is never written),
// so a device there would never see the machine's writes; block devices are
// taken as extra disks, which are written in place until the first fork.
func checkBootDiskNotBlock(path string) error {
	if overlay.IsBlockDevice(path) {
		return fmt.Errorf("disk image %q is a block device: only extra disks may be (--disk id=ID,file=%s after the boot disk), see %s: %w",
			path, path, BlockDisksDoc, ErrInvalid)
	}
	return nil
}

// BlockDisker is the optional driver capability to run extra disks on
// block devices: QEMU must open them with its host_device driver, and the
// libvirt driver's domains describe every disk as a file.
type BlockDisker interface {
	BlockDisks() bool
}

// checkBlockDiskSupport refuses, before anything changes, an extra disk of
// s on a block device when this manager's driver cannot run one
// (BlockDisker).
func (mg *Manager) checkBlockDiskSupport(s Spec) error {
	bd, _ := mg.Driver.(BlockDisker)
	if bd != nil && bd.BlockDisks() {
		return nil
	}
	for _, d := range s.Disks {
		if overlay.IsBlockDevice(d.File) {
			return fmt.Errorf("driver %q cannot run disk %q on block device %s (see %s): %w", mg.Driver.Name(), d.ID, d.File, BlockDisksDoc, ErrInvalid)
		}
	}
	return nil
}

// checkBlockDisksFree refuses a boot whose block disk another machine of
// the store has (written in place, or the base of its overlays), that a
// template kept after its source went holds frozen, or that the spec
// gives twice: a device is one machine's, and its family's once
// it forks. Read-only shared views of a device no one writes may be many.
func (mg *Manager) checkBlockDisksFree(s Spec) error {
	var ms []*Machine
	var ts []*Template
	seen := map[string]string{}
	for _, d := range s.Disks {
		if !overlay.IsBlockDevice(d.File) {
			continue
		}
		dev := filepath.Clean(d.File)
		if other, ok := seen[dev]; ok {
			return fmt.Errorf("disk %q: block device %s is disk %q too: one disk per device: %w", d.ID, dev, other, ErrInvalid)
		}
		seen[dev] = d.ID
		if ms == nil {
			var err error
			if ms, err = mg.Store.ListMachines(); err != nil {
				return err
			}
		}
		for _, m := range ms {
			for _, o := range m.Spec.Disks {
				if filepath.Clean(o.File) != dev || (d.Policy() == DiskShared && o.Policy() == DiskShared) {
					continue
				}
				return fmt.Errorf("disk %q: block device %s is machine %q's disk %q already (written in place, or the base of its overlays): %w", d.ID, dev, m.Name, o.ID, ErrInvalid)
			}
		}
		if d.Policy() == DiskShared {
			continue // a read-only view changes nothing under a template
		}
		// A template kept after its source went still has the device as
		// its frozen base: written in place, it would change under the
		// template's children.
		if ts == nil {
			var err error
			if ts, err = mg.Store.ListTemplates(); err != nil {
				return err
			}
		}
		for _, t := range ts {
			for _, td := range t.Disks {
				if td.Foreign && filepath.Clean(td.File) == dev {
					name := t.ID
					if t.Name != "" {
						name = t.Name
					}
					return fmt.Errorf("disk %q: block device %s is the frozen base of template %q's disk %q (vmfork template rm %s first): %w", d.ID, dev, name, td.ID, name, ErrInvalid)
				}
			}
		}
	}
	return nil
}

// blockDiskFile is extra disk d on a block device as a machine first
// opens it: the device itself, in place (read-only when shared), with the
// format it holds (raw, or a qcow2 written onto the volume).
func blockDiskFile(d DiskSpec) (DiskFile, error) {
	f, err := overlay.Format(d.File)
	if err != nil {
		return DiskFile{}, fmt.Errorf("disk %q: %w", d.ID, err)
	}
	df := DiskFile{File: d.File, Block: true, ReadOnly: d.Policy() == DiskShared}
	if f != "qcow2" {
		df.Format = string(f)
	}
	return df, nil
}

// freezeStoppedBlock freezes stopped src's block disk td where it is: the
// source gets a new overlay on the device in its own directory.
func freezeStoppedBlock(ctx context.Context, src *Machine, td TemplateDisk) error {
	cur := src.Paths.Disks[td.ID]
	if busy, err := overlay.InUse(cur.File); err != nil || busy {
		if err == nil {
			err = fmt.Errorf("disk %s is in use by a running process: %w", cur.File, ErrInvalid)
		}
		return err
	}
	chain, err := overlay.Chain(cur.File)
	if err != nil {
		return fmt.Errorf("disk %q: %w", td.ID, err)
	}
	next, err := NextDiskTop(src.Paths.Dir, td.ID)
	if err != nil {
		return err
	}
	if err := overlay.CreateOn(ctx, td.File, chain[0].Format, chain[0].VirtualSize, next); err != nil {
		return fmt.Errorf("disk %q: %w", td.ID, err)
	}
	src.Paths.Disks[td.ID] = DiskFile{File: next}
	return nil
}

// blockDiskAction says what fork plan p does with block disk id of the
// source, whose policy for this fork is pol; "" when the disk is not on a
// block device or nothing about it differs from a file disk.
func (p *forkPlan) blockDiskAction(id string, pol DiskPolicy) string {
	f, ok := p.source.Paths.Disks[id]
	if !ok || !f.Block || p.mode == forkKept || p.mode == forkHibernated {
		return ""
	}
	switch {
	case f.ReadOnly:
		return fmt.Sprintf("disk %q: %s, block device %s read-only already; every child gets it read-only", id, pol, f.File)
	case pol == DiskCow || pol == DiskShared:
		each := "each child writes to its own overlay"
		if pol == DiskShared {
			each = "every child gets it read-only"
		}
		return fmt.Sprintf("disk %q: %s, block device %s frozen in the same pause: it becomes the read-only base, never written again until vmfork disk commit; the source writes to an overlay in the state dir, %s", id, pol, f.File, each)
	default:
		return fmt.Sprintf("disk %q: %s, block device %s stays the source's, written in place; each child gets an empty disk of the same size (VMFORK_DISK_%s=fresh)", id, pol, f.File, strings.ToUpper(id))
	}
}

// DiskCommit is what CommitDisk did with one block disk.
type DiskCommit struct {
	Machine string `json:"machine"`
	ID      string `json:"id"`
	Device  string `json:"device"`
	// Layers are the overlays whose writes went onto the device, top
	// first; none when the machine already wrote to the device itself.
	Layers []string `json:"layers"`
	// Bytes is what those layers held (allocated on the host).
	Bytes int64 `json:"bytes"`
	MS    int64 `json:"ms"`
}

// CommitDisk writes stopped machine name's overlays on its block disks
// back onto the devices and puts the machine on the devices again, written
// in place; id "" is every block disk. It refuses, before anything is
// written, while another machine or a template that is kept, hibernated or
// has children reads a device as its base: their view would change under
// them.
//
// The machine must be stopped. It runs qemu-img commit, not QMP
// block-commit on the running machine: a live active-layer commit (a
// mirror job, then block-job-complete pivoting QEMU onto the device
// read-write) would leave a running QEMU on a third kind of disk graph that
// every later freeze (qemudrv/fork.go:prepareExtraDisks) and crash repair
// (journal.go:repairSourceDisk) would have to know; a stopped machine
// has no graph, and its image locks say no QEMU holds the overlay. A commit
// cut short is safe to run again: qemu-img commit -b leaves the top intact
// (-b implies -d), the record still points at it, and the data written to
// the device so far is what the second run writes again.
func (mg *Manager) CommitDisk(ctx context.Context, name, id string) ([]DiskCommit, error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("disk commit: %w", err)
	}
	// Templates whose children are gone go first (their collection
	// takes each machine's lock briefly: not under ours).
	mg.collectTemplates(ctx)
	out, err := mg.commitLocked(ctx, name, id)
	if err == nil {
		// The templates that froze the device are unused now.
		mg.collectTemplates(ctx)
	}
	return out, err
}

func (mg *Manager) commitLocked(ctx context.Context, name, id string) ([]DiskCommit, error) {
	l := mg.locks()
	defer l.release()
	if err := l.take(ctx, name); err != nil {
		return nil, fmt.Errorf("disk commit: %w", err)
	}
	m, err := mg.Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("disk commit: %w", err)
	}
	disks, err := blockDisksOf(m, id)
	if err != nil {
		return nil, fmt.Errorf("disk commit %q: %w", name, err)
	}
	if m.State != StateStopped {
		return nil, fmt.Errorf("disk commit %q: machine is %s: stop it first (vmfork stop %s), the overlay must not change while it is copied: %w", name, m.State, name, ErrInvalid)
	}
	for _, d := range disks {
		if err := mg.checkDeviceUnused(ctx, m, d); err != nil {
			return nil, fmt.Errorf("disk commit %q: %w", name, err)
		}
	}
	var out []DiskCommit
	for _, d := range disks {
		c, err := mg.commitOne(ctx, m, d)
		if err != nil {
			return out, fmt.Errorf("disk commit %q: %w", name, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// blockDisksOf returns m's extra disks on block devices, or only disk id.
func blockDisksOf(m *Machine, id string) ([]DiskSpec, error) {
	var out []DiskSpec
	for _, d := range m.Spec.Disks {
		block := overlay.IsBlockDevice(d.File)
		if id != "" && d.ID == id {
			if !block {
				return nil, fmt.Errorf("disk %q is not on a block device (%s): only a block disk's overlay is committed: %w", id, d.File, ErrInvalid)
			}
			return []DiskSpec{d}, nil
		}
		if id == "" && block {
			out = append(out, d)
		}
	}
	if id != "" {
		return nil, fmt.Errorf("no disk %q (the machine's disks: %s): %w", id, strings.Join(m.Spec.diskIDs(), ", "), ErrInvalid)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no disk on a block device (the machine's disks: %s): %w", strings.Join(m.Spec.diskIDs(), ", "), ErrInvalid)
	}
	return out, nil
}

// checkDeviceUnused refuses a commit of m's block disk d while any other
// machine reads the device, or a template that is kept, hibernated, in a
// command's hands or has children does. A template nobody needs but whose
// image is a layer of m's own chain (an earlier fork's) is no obstacle: the
// commit takes its data too, and it is collected after.
func (mg *Manager) checkDeviceUnused(ctx context.Context, m *Machine, d DiskSpec) error {
	dev := filepath.Clean(d.File)
	ms, err := mg.Store.ListMachines()
	if err != nil {
		return err
	}
	for _, o := range ms {
		if o.Name == m.Name {
			continue
		}
		chain, err := extraDiskChains(o)
		if err != nil {
			return fmt.Errorf("disk %q: machine %q: %w", d.ID, o.Name, err)
		}
		for _, l := range chain {
			if filepath.Clean(l.Path) == dev {
				return fmt.Errorf("disk %q: machine %q still reads %s as its base (vmfork rm it first): %w", d.ID, o.Name, dev, ErrInvalid)
			}
		}
	}
	ts, err := mg.Store.ListTemplates()
	if err != nil {
		return err
	}
	u, ok := mg.templateUseOf(ctx, ms)
	if !ok {
		return fmt.Errorf("disk %q: a machine's disk chain does not read: cannot tell who reads %s", d.ID, dev)
	}
	busy := mg.Store.inFlightTemplates()
	for _, t := range ts {
		why := ""
		switch {
		case busy[t.ID]:
			why = "a command in progress is making it"
		case t.Name != "":
			why = fmt.Sprintf("it is kept as %q (vmfork template rm)", t.Name)
		case u.hibernated[t.ID]:
			why = "it holds a hibernated machine"
		case u.users[t.ID] > 0:
			why = fmt.Sprintf("%d children run from it (vmfork rm them first)", u.users[t.ID])
		default:
			continue
		}
		for _, td := range t.Disks {
			if td.File == "" {
				continue
			}
			chain, err := overlay.Chain(td.File)
			if err != nil {
				return fmt.Errorf("disk %q: template %s: %w", d.ID, t.ID, err)
			}
			for _, l := range chain {
				if filepath.Clean(l.Path) == dev {
					return fmt.Errorf("disk %q: template %s still has %s as its base: %s: %w", d.ID, t.ID, dev, why, ErrInvalid)
				}
			}
		}
	}
	return nil
}

// commitOne commits m's block disk d (see CommitDisk) and saves m.
func (mg *Manager) commitOne(ctx context.Context, m *Machine, d DiskSpec) (DiskCommit, error) {
	c := DiskCommit{Machine: m.Name, ID: d.ID, Device: d.File, Layers: []string{}}
	cur, ok := m.Paths.Disks[d.ID]
	if !ok || cur.Block {
		// Never started, or written in place: nothing to commit, but a
		// top an earlier commit cut short after its record left goes.
		RemoveOldDiskTops(m)
		return c, nil
	}
	chain, err := overlay.Chain(cur.File)
	if err != nil {
		return c, fmt.Errorf("disk %q: %w", d.ID, err)
	}
	if last := chain[len(chain)-1]; filepath.Clean(last.Path) != filepath.Clean(d.File) {
		return c, fmt.Errorf("disk %q: its overlay %s is not on %s but on %s: %w", d.ID, cur.File, d.File, last.Path, ErrInvalid)
	}
	if busy, err := overlay.InUse(cur.File); err != nil || busy {
		if err == nil {
			err = fmt.Errorf("disk %q: %s is in use by a running process: %w", d.ID, cur.File, ErrInvalid)
		}
		return c, err
	}
	for _, l := range chain[:len(chain)-1] {
		c.Layers = append(c.Layers, l.Path)
		c.Bytes += l.AllocatedBytes
	}
	start := time.Now()
	if err := overlay.CommitInto(ctx, cur.File, d.File); err != nil {
		return c, fmt.Errorf("disk %q: %w", d.ID, err)
	}
	c.MS = time.Since(start).Milliseconds()
	Fault(FaultDiskCommitted, 0)
	f, err := blockDiskFile(d)
	if err != nil {
		return c, err
	}
	// The record first: a crash after it leaves only old tops, which the
	// next commit or stop removes (RemoveOldDiskTops).
	m.Paths.Disks[d.ID] = f
	if err := mg.Store.SaveMachine(m); err != nil {
		return c, err
	}
	Fault(FaultDiskRecorded, 0)
	if err := os.Remove(cur.File); err != nil && !errors.Is(err, fs.ErrNotExist) {
		mg.Log.WithField("machine", m.Name).WithError(err).Warn("could not remove the committed overlay")
	}
	RemoveOldDiskTops(m)
	return c, nil
}
