//go:build cgo

package libvirtdrv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
)

// Adopt implements vmfork.Adopter for a libvirt domain that vmfork did not
// make, such as one an operator defined with virsh. It reads the domain's
// live definition and returns a record of it, and changes nothing on the
// host: no metadata is written and no QMP or agent command is sent, either
// of which libvirt would show (a changed definition, a taint).
//
// It refuses a domain vmfork made (it carries vmfork's mark), one that Check
// finds unforkable (naming every XML element to change), one that is not
// running, one whose guest agent is disconnected, and one whose QEMU could
// not reach the overlay its first fork puts in the state dir.
func (d *Driver) Adopt(ctx context.Context, name string, paths vmfork.Paths) (*vmfork.Machine, error) {
	dom, err := d.conn.LookupDomainByName(name)
	if errors.Is(err, libvirt.ERR_NO_DOMAIN) {
		return nil, fmt.Errorf("no vmfork machine and no libvirt domain of that name: %w", vmfork.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("look up domain %q: %w", name, wrap(err))
	}
	defer dom.Free()
	// The live definition of a running domain, the persistent one otherwise:
	// a shut-off domain is checked too, so the refusal below comes with the
	// full list of what to change before starting it.
	_, def, err := liveXML(ctx, dom, 0)
	if err != nil {
		return nil, err
	}
	if md := metadataOf(def); md != nil {
		return nil, fmt.Errorf("domain %q is vmfork machine %q of %s: use that state dir: %w", name, md.Machine, md.MachineDir, vmfork.ErrInvalid)
	}
	if err := checkAdopt(def); err != nil {
		return nil, err
	}
	st, _, err := dom.GetState()
	if err != nil {
		return nil, fmt.Errorf("domain %q state: %w", name, wrap(err))
	}
	switch st {
	case libvirt.DOMAIN_RUNNING, libvirt.DOMAIN_BLOCKED:
	case libvirt.DOMAIN_PAUSED:
		return nil, fmt.Errorf("domain %q is paused: resume it (virsh resume %s) to fork it: %w", name, name, vmfork.ErrNotRunning)
	default:
		// A stopped source's children boot from its record, which cannot
		// hold all of an operator's domain definition.
		return nil, fmt.Errorf("domain %q is shut off: an existing domain is forked while it runs; start it (virsh start %s): %w", name, name, vmfork.ErrNotRunning)
	}
	if c := agentChannelOf(def.Devices); c.Target.VirtIO.State == "disconnected" {
		return nil, fmt.Errorf("domain %q: the guest agent channel %s is disconnected: start qemu-guest-agent in the guest", name, agentChannel)
	}
	if uid, gid, ok := parseDACLabel(dacLabel(def)); ok && qemuIsOther(uid, gid) {
		if err := checkReach(stateDirOf(paths.Dir), uid, gid); err != nil {
			return nil, fmt.Errorf("domain %q: %w", name, err)
		}
	}
	uuid, err := dom.GetUUIDString()
	if err != nil {
		return nil, fmt.Errorf("domain %q uuid: %w", name, wrap(err))
	}
	m := &vmfork.Machine{
		Name: name, Driver: Name, State: vmfork.StateRunning, PID: qemuPID(d.uri, name),
		Accel: accelTCG, Spec: specOf(def), Paths: paths, Created: time.Now().UTC(),
		Adopted: &vmfork.Adoption{ID: uuid},
	}
	if def.Type == domainKVM {
		m.Accel = accelKVM
	}
	if def.GenID != nil {
		m.VMGenID = def.GenID.Value
	}
	if disks := writableFileDisks(def); len(disks) > 0 {
		disk := disks[0].file
		m.Spec.Disk, m.Paths.Disk, m.Adopted.Disk = disk, disk, disk
		m.Spec.DiskID = disks[0].target
		// Every further writable file disk forks too, cow, by its
		// target's name (vdb, ...): the owner edits nothing.
		for _, x := range disks[1:] {
			m.Spec.Disks = append(m.Spec.Disks, vmfork.DiskSpec{ID: x.target, File: x.file})
			if m.Paths.Disks == nil {
				m.Paths.Disks = map[string]vmfork.DiskFile{}
			}
			m.Paths.Disks[x.target] = vmfork.DiskFile{File: x.file}
		}
	}
	// libvirt owns QMP and the agent socket; its own logs are the logs.
	m.Paths.QMP, m.Paths.QGA = "", ""
	m.Paths.Log = qemuLog(d.uri, name, "")
	m.Paths.Serial = serialLog(def)
	mb := def.MemoryBacking
	m.Paths.RAM, m.Paths.RAMShared = "", mb.MemoryAccess != nil && mb.MemoryAccess.Mode == "shared"
	if id, err := dom.GetID(); err == nil && isLocalSystem(d.uri) {
		if dir, err := MemoryBackingDir(d.QEMUConf); err == nil {
			m.Paths.RAM = ramFile(dir, int(id), name)
		}
	}
	return m, nil
}

// Disown implements vmfork.Adopter: nil once adopted machine m's domain uses
// no file in the state dir (in its live disk chains or its persistent
// definition) or is gone. The domain is looked up by uuid and by name, so
// that one renamed, or defined anew under the same name, still counts.
// vmfork never writes the domain's own image, so merging the overlay a fork
// moved it onto back into that image is left to its owner, and the error
// says how.
func (d *Driver) Disown(ctx context.Context, m *vmfork.Machine) error {
	byUUID, err := d.conn.LookupDomainByUUIDString(m.Adopted.ID)
	if err == nil {
		defer byUUID.Free()
		if err := d.disown(ctx, byUUID, m); err != nil {
			return err
		}
	} else if !errors.Is(err, libvirt.ERR_NO_DOMAIN) {
		return fmt.Errorf("look up domain %s: %w", m.Adopted.ID, wrap(err))
	}
	byName, err := d.conn.LookupDomainByName(m.Name)
	if errors.Is(err, libvirt.ERR_NO_DOMAIN) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up domain %q: %w", m.Name, wrap(err))
	}
	defer byName.Free()
	return d.disown(ctx, byName, m)
}

func (d *Driver) disown(ctx context.Context, dom *libvirt.Domain, m *vmfork.Machine) error {
	stateDir := stateDirOf(m.Paths.Dir)
	name, err := dom.GetName()
	if err != nil {
		return fmt.Errorf("domain name: %w", wrap(err))
	}
	check := func(which string, flags libvirt.DomainXMLFlags) error {
		_, def, err := liveXML(ctx, dom, flags)
		if err != nil {
			return err
		}
		target, used := usedFile(def, stateDir)
		if used == "" {
			return nil
		}
		base := m.Adopted.Disk
		if b := extraBase(m, target); b != "" {
			base = b
		}
		if base == "" {
			base = "IMAGE"
		}
		return fmt.Errorf("domain %q still uses %s in vmfork's state dir (disk %s, %s definition): vmfork never writes the domain's own image, "+
			"so merge the overlay into it once the domain's fork children are gone, with the domain running: "+
			"virsh blockcommit %s %s --base %s --active --pivot; then run vmfork rm again",
			name, used, target, which, name, target, base)
	}
	if active, err := dom.IsActive(); err == nil && active {
		if err := check("live", 0); err != nil {
			return err
		}
	}
	if persistent, err := dom.IsPersistent(); err == nil && persistent {
		return check("persistent", libvirt.DOMAIN_XML_INACTIVE)
	}
	return nil
}

// usedFile returns the first file in dir that a disk of def uses, as its
// source or in its backing chain, and that disk's target.
func usedFile(def *libvirtxml.Domain, dir string) (target, used string) {
	if def.Devices == nil {
		return "", ""
	}
	for _, disk := range def.Devices.Disks {
		if disk.Source == nil || disk.Source.File == nil || disk.Source.File.File == "" {
			continue
		}
		files := []string{disk.Source.File.File}
		if chain, err := overlay.Chain(disk.Source.File.File); err == nil {
			for _, l := range chain {
				files = append(files, l.Path)
			}
		}
		for _, f := range files {
			if within(dir, f) {
				return diskName(&disk), f
			}
		}
	}
	return "", ""
}

// specOf describes domain def as a vmfork.Spec, for the record and the
// template manifest; the domain's XML, not the Spec, is what children copy.
func specOf(def *libvirtxml.Domain) vmfork.Spec {
	var s vmfork.Spec
	if def.OS != nil {
		s.Kernel, s.Initrd, s.Append = def.OS.Kernel, def.OS.Initrd, def.OS.Cmdline
		if def.OS.Type != nil {
			s.MachineType = def.OS.Type.Machine
		}
	}
	if def.Memory != nil {
		s.MemoryMiB = int(memoryBytes(def.Memory.Value, def.Memory.Unit) >> 20)
	}
	if def.VCPU != nil {
		s.CPUs = int(def.VCPU.Value)
		if def.VCPU.Current != 0 {
			s.CPUs = int(def.VCPU.Current)
		}
	}
	if def.CPU != nil {
		s.CPUModel = def.CPU.Mode
		if def.CPU.Model != nil && def.CPU.Model.Value != "" {
			s.CPUModel = def.CPU.Model.Value
		}
	}
	if def.Devices != nil && len(def.Devices.Interfaces) > 0 && def.Devices.Interfaces[0].MAC != nil {
		s.MAC = def.Devices.Interfaces[0].MAC.Address
	}
	s.Network = networkOf(def)
	return s
}

// memoryBytes converts a libvirt memory size (default unit KiB) to bytes.
func memoryBytes(v uint, unit string) uint64 {
	n := uint64(v)
	switch strings.ToLower(unit) {
	case "b", "bytes":
		return n
	case "kb":
		return n * 1000
	case "mb":
		return n * 1000 * 1000
	case "gb":
		return n * 1000 * 1000 * 1000
	case "m", "mib":
		return n << 20
	case "g", "gib":
		return n << 30
	case "t", "tib":
		return n << 40
	}
	return n << 10 // "", "k", "KiB"
}

// writableFileDisk returns the source of def's first writable file disk,
// the boot disk of its record (Adopt); the others are its extra disks.
func writableFileDisk(def *libvirtxml.Domain) string {
	if ds := writableFileDisks(def); len(ds) > 0 {
		return ds[0].file
	}
	return ""
}

// fileDisk is a writable file disk of a domain: its target and file.
type fileDisk struct{ target, file string }

// writableFileDisks returns def's writable file disks in order.
func writableFileDisks(def *libvirtxml.Domain) []fileDisk {
	if def.Devices == nil {
		return nil
	}
	var out []fileDisk
	for _, disk := range def.Devices.Disks {
		if !isWritable(&disk) {
			continue
		}
		if disk.Source != nil && disk.Source.File != nil {
			out = append(out, fileDisk{diskName(&disk), disk.Source.File.File})
		}
	}
	return out
}

// isWritable reports whether a <disk> is one a fork freezes: not a cdrom,
// not read-only, not shareable.
func isWritable(disk *libvirtxml.DomainDisk) bool {
	return disk.Device != "cdrom" && disk.ReadOnly == nil && disk.Shareable == nil
}

// serialLog returns where libvirt logs the domain's serial console, if it
// does.
func serialLog(def *libvirtxml.Domain) string {
	if def.Devices == nil || len(def.Devices.Serials) == 0 {
		return ""
	}
	s := def.Devices.Serials[0]
	switch {
	case s.Log != nil:
		return s.Log.File
	case s.Source != nil && s.Source.File != nil:
		return s.Source.File.Path
	}
	return ""
}

// stateDirOf is the state dir of a machine or template directory
// (<state-dir>/machines/<name>, <state-dir>/templates/<id>).
func stateDirOf(dir string) string { return filepath.Dir(filepath.Dir(dir)) }

// qemuIsOther reports whether QEMU runs as another user than vmfork, so
// that the directories vmfork makes (mode 0700) are out of its reach.
func qemuIsOther(uid, gid int) bool { return uid != os.Geteuid() || gid != os.Getegid() }
