package libvirtdrv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
)

var _ vmfork.MultiDisker = (*Driver)(nil)

// DiskPolicies implements vmfork.MultiDisker: a child's extra disks are
// what its domain XML points at (childDisks), whatever the policy.
func (d *Driver) DiskPolicies() []vmfork.DiskPolicy {
	return []vmfork.DiskPolicy{vmfork.DiskCow, vmfork.DiskShared, vmfork.DiskFresh, vmfork.DiskKeep}
}

// BootsDisks implements vmfork.MultiDisker: the domains this driver defines
// from a record alone (BootXML) have every disk of it (extraBootDisks).
func (d *Driver) BootsDisks() bool { return true }

// extraSwitch is one extra disk the fork's snapshot switches.
type extraSwitch struct {
	id, target, next string
	// link is the template's name for the disk's current top, made in the
	// pause; empty when the freeze needs none (an owner's image, linked
	// or recorded where it is before the pause).
	link string
}

// prepareExtraDisks makes, before the pause, the next top of every extra
// disk of src that the freeze switches (vmfork.TemplateDisk.Frozen), as
// prepareDisk does for the boot disk, and takes their targets out of
// p.otherDisks.
func prepareExtraDisks(ctx context.Context, live *libvirtxml.Domain, src *vmfork.Machine, t *vmfork.Template, p *freezePrep) error {
	for i := range t.Disks {
		td := &t.Disks[i]
		if !td.Frozen() {
			continue
		}
		cur := src.Paths.Disks[td.ID].File
		target := ""
		for _, disk := range live.Devices.Disks {
			if disk.Source != nil && disk.Source.File != nil && overlay.SameFile(disk.Source.File.File, cur) {
				target = diskName(&disk)
			}
		}
		if target == "" {
			return fmt.Errorf("domain %q has no disk %s (disk %q)", src.Name, cur, td.ID)
		}
		chain, err := overlay.Chain(cur)
		if err != nil {
			return fmt.Errorf("disk %q: %w", td.ID, err)
		}
		next, err := vmfork.NextDiskTop(src.Paths.Dir, td.ID)
		if err != nil {
			return err
		}
		x := extraSwitch{id: td.ID, target: target, next: next, link: td.File}
		backing := td.File
		if !within(src.Paths.Dir, cur) {
			// The owner's image: frozen where it is, never written, and
			// the base of the source's new overlay there (prepareDisk).
			if err := linkForeign(cur, td); err != nil {
				return fmt.Errorf("disk %q: %w", td.ID, err)
			}
			x.link, backing = "", cur
		}
		if err := overlay.CreateOn(ctx, backing, chain[0].Format, chain[0].VirtualSize, next); err != nil {
			return fmt.Errorf("disk %q: %w", td.ID, err)
		}
		p.extras = append(p.extras, x)
		for j, n := range p.otherDisks {
			if n == target {
				p.otherDisks = append(p.otherDisks[:j], p.otherDisks[j+1:]...)
				break
			}
		}
	}
	return nil
}

// linkForeign gives template disk td the owner's image at path as
// freezeForeign gives a template its boot disk: a hard link in the
// template's directory, or, where none can be made or would work, the
// image where it is (td.Foreign).
func linkForeign(path string, td *vmfork.TemplateDisk) error {
	rel, err := relativeBacking(path)
	if err != nil {
		return err
	}
	if !rel {
		err := os.Link(path, td.File)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EXDEV) && !errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("freeze disk: %w", err)
		}
	}
	td.File, td.Owned, td.Foreign = path, false, true
	return nil
}

// snapshotExtras links each switched extra disk's top into the template
// (undone if the pause fails) and returns their snapshot entries.
func snapshotExtras(src *vmfork.Machine, p *freezePrep, onFailure func(func() error)) ([]libvirtxml.DomainSnapshotDisk, error) {
	var out []libvirtxml.DomainSnapshotDisk
	for _, x := range p.extras {
		if x.link != "" {
			if err := os.Link(src.Paths.Disks[x.id].File, x.link); err != nil {
				return nil, fmt.Errorf("disk %q: %w", x.id, err)
			}
			link := x.link
			onFailure(func() error { return os.Remove(link) })
		}
		out = append(out, libvirtxml.DomainSnapshotDisk{
			Name: x.target, Snapshot: "external",
			Driver: &libvirtxml.DomainDiskDriver{Type: "qcow2"},
			Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: x.next}},
		})
	}
	return out, nil
}

// childDisks points the source's writable file disks at the child's
// images: the first at its boot disk's overlay, each other one at the
// image of the extra disk its target names (adopt.go), read-only when the
// child shares it. libvirt reads the backing chain from each image's
// header, so the source's <backingStore> is dropped.
func childDisks(dev *libvirtxml.DomainDeviceList, c *vmfork.Machine) error {
	writable := 0
	for i := range dev.Disks {
		disk := &dev.Disks[i]
		if !isWritable(disk) {
			continue
		}
		if disk.Source == nil || disk.Source.File == nil {
			return fmt.Errorf("disk %s is not a file: only file disks can be forked", diskName(disk))
		}
		writable++
		var f vmfork.DiskFile
		switch {
		case writable == 1 && c.Spec.Disk == "":
			return fmt.Errorf("disk %s: the machine's record has no disk for it", diskName(disk))
		case writable == 1:
			f.File = c.Paths.Disk
		default:
			id := diskID(disk, c.Spec)
			var ok bool
			if f, ok = c.Paths.Disks[id]; !ok {
				return fmt.Errorf("disk %s: the machine's record has no disk %q for it", diskName(disk), id)
			}
		}
		disk.Source.File.File = f.File
		disk.BackingStore, disk.Alias = nil, nil
		if disk.Driver == nil {
			disk.Driver = &libvirtxml.DomainDiskDriver{Name: "qemu"}
		}
		// Every image vmfork makes is qcow2, whatever its source's was (an
		// adopted domain's may be raw).
		disk.Driver.Type = "qcow2"
		if f.ReadOnly {
			disk.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
			if f.Format != "" {
				disk.Driver.Type = f.Format
			}
		}
	}
	if c.Spec.Disk != "" && writable == 0 {
		return fmt.Errorf("source domain XML has no writable file disk for %s", c.Paths.Disk)
	}
	return nil
}

// diskID is the id of the extra disk of spec s that disk is: the one its
// serial names (a domain vmfork booted, extraBootDisks), else the one its
// target names (an adopted domain's, Adopt). An operator's serial that
// happens to be another disk's target is taken as that disk's id: give
// such a domain's disks other serials, or none.
func diskID(disk *libvirtxml.DomainDisk, s vmfork.Spec) string {
	if disk.Serial != "" {
		for _, d := range s.Disks {
			if d.ID == disk.Serial {
				return d.ID
			}
		}
	}
	return diskName(disk)
}

// extraBase is the owner's image of the disk at target of adopted machine
// m, for the merge Disown asks for.
func extraBase(m *vmfork.Machine, target string) string {
	for _, d := range m.Spec.Disks {
		if d.ID == target {
			return filepath.Clean(d.File)
		}
	}
	return ""
}
