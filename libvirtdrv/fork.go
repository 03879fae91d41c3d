//go:build cgo

package libvirtdrv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/sharedmem"
)

const (
	// devStateFD is the name under which the device-state file is handed to
	// QEMU: libvirt's seccomp sandbox (spawn=deny) kills QEMU on exec:.
	devStateFD = "vmfork-devstate"
	// FileSourceXML is the driver's file in a template's directory: the
	// source's migratable domain XML at the freeze, which children copy.
	// Archives and pushes carry it (vmfork.FileDomainXML).
	FileSourceXML = vmfork.FileDomainXML
)

// Freeze implements vmfork.Forker with libvirt's suspend and resume (so its
// state machine stays in step), a disk-only external snapshot onto an
// overlay made ahead (so libvirt's view of the disk stays true), the
// device-state save through QMP passthrough with a passed fd, and the RAM
// plan the embedded driver uses (sharedmem.Plan): the source's RAM file
// becomes the template by a second name in vmfork's mem dir, and the source
// is remapped privately onto it, so the pause copies no RAM. The domain
// stays the same (name, uuid, QEMU process); libvirt's own name for the file
// goes when the domain stops, the template's stays.
func (d *Driver) Freeze(ctx context.Context, src *vmfork.Machine, t *vmfork.Template, opts vmfork.FreezeOptions) (fr vmfork.FreezeResult, err error) {
	dom, err := d.domain(src)
	if err != nil {
		return fr, err
	}
	if dom == nil {
		return fr, fmt.Errorf("machine %q: %w", src.Name, vmfork.ErrNotRunning)
	}
	defer dom.Free()
	replug, err := d.detachDevices(ctx, dom, src, t, opts.DetachDevices) // --detach-devices (detach.go)
	if err != nil {
		return fr, err
	}
	defer replug(ctx)
	mon := d.monitor(dom, src)
	prep, err := d.prepareFreeze(ctx, dom, mon, src, t)
	if err != nil {
		return fr, err
	}
	defer prep.cleanup()
	ram, err := d.prepareRAM(ctx, mon, src, t, prep, opts.Delta)
	if err != nil {
		return fr, fmt.Errorf("prepare RAM: %w", err)
	}
	defer ram.Cleanup(ctx, mon)
	recipe := sharedmem.Recipe{
		Source: sharedmem.PauseSource{
			Pause:       func(ctx context.Context) error { return suspend(ctx, dom) },
			Resume:      func(ctx context.Context) error { return resume(ctx, dom) },
			StillPaused: vmfork.ErrStillPaused,
		},
		RAM: ram,
		AfterRAM: func(context.Context) error {
			if ram.Mode == sharedmem.Delta {
				// No new file for QEMU: the base is the file the
				// source's QEMU maps already, and only vmfork reads
				// the delta (delta.go).
				return nil
			}
			return grantRAM(t.Paths.RAM, prep.owner)
		},
		Paused: func() { vmfork.Fault(vmfork.FaultFreezePaused, src.PID) },
		// Hibernate's: the domain stays paused until it is destroyed.
		LeavePaused: opts.LeavePaused,
	}
	release, err := prepareDevState(ctx, mon, t, ram, &recipe)
	if err != nil {
		return fr, err
	}
	defer release()
	if prep.diskTarget != "" {
		recipe.SwitchDisk = func(ctx context.Context, w *sharedmem.PauseWindow) error {
			return d.switchDisk(ctx, dom, src, t, prep, w)
		}
	}
	frozen, err := recipe.Run(ctx)
	if err != nil {
		return fr, err
	}
	fr.Pause, fr.RAMCopiedBytes = frozen.Pause, frozen.CopiedBytes
	fr.RAMMode, fr.PrecopiedBytes = ram.Mode.String(), ram.Precopied
	if fi, err := os.Stat(t.Paths.DevState); err == nil {
		t.Manifest.DevStateBytes = fi.Size()
	}
	t.Manifest.RAMSharedWithChildren = ram.Mode != sharedmem.Stream
	recordDelta(t, ram, mon.log)
	mon.log.WithFields(logrus.Fields{
		"template": t.ID, "pause": fr.Pause, "ram_mode": ram.Mode.String(), "tracked": ram.Tracked(),
		"precopied_bytes": ram.Precopied, "paused_copy_bytes": fr.RAMCopiedBytes,
		"devstate_format": t.Manifest.DevStateFormat,
		// What the disk switch cost inside disk_ms, and against how long a
		// chain: libvirt's snapshot call is most of a libvirt pause.
		"snapshot_ms": prep.snapshotMS, "backing_chain": prep.chainLen,
	}).WithFields(frozen.Phases()).Debug("frozen")
	return fr, nil
}

// prepareRAM plans, before the pause, how src's RAM becomes t's. The
// source keeps the file QEMU opened under libvirt's name for it (libvirt
// removes that name when the domain stops); with libvirt's RAM directory on
// another file system than vmfork's mem dir no template can be that file,
// and the freeze copies it in the pause, saying why. With delta (a `vmfork
// fork`, whose children this driver starts) the template may be a delta on
// the frozen file the source maps (delta.go).
func (d *Driver) prepareRAM(ctx context.Context, mon monitor, src *vmfork.Machine, t *vmfork.Template, prep *freezePrep, delta bool) (*sharedmem.Plan, error) {
	shared, err := sharedmem.QOMShare(ctx, mon, ramAlias)
	if err != nil {
		return nil, err
	}
	pid := qemuPID(d.uri, src.Name)
	if pid == 0 {
		return nil, fmt.Errorf("machine %q: no QEMU pid in libvirt's run dir", src.Name)
	}
	req := sharedmem.PlanRequest{
		PID: pid, SizeBytes: int64(src.Spec.MemoryMiB) << 20, Shared: shared && prep.shared,
		RAM: prep.ram, Own: prep.ram, Template: t.Paths.RAM,
		Temp:   filepath.Join(filepath.Dir(t.Paths.RAM), "."+t.ID+".ram.tmp"),
		Suffix: ".ram",
	}
	if delta {
		allowDelta(&req, src, t)
	}
	p, err := sharedmem.Prepare(ctx, mon, req)
	if err != nil {
		return nil, fmt.Errorf("machine %q: %w", src.Name, err)
	}
	if p.CopyReason != nil {
		mon.log.WithError(p.CopyReason).Warn("no RAM remap here: the freeze copies the RAM file while paused")
	}
	return p, nil
}

// prepareDevState readies r's device-state save before the pause
// (qemustate.PrepareDeviceState, as on the embedded driver; devstate.go says why it
// matters more here), through the passthrough, and records its format in t's
// manifest. A child's domain keeps qemustate.DevicesOnlyArgs from its source's
// XML, so a migration stream it saves has no configuration section either,
// and its children have the arguments too.
func prepareDevState(ctx context.Context, mon monitor, t *vmfork.Template, ram *sharedmem.Plan, r *sharedmem.Recipe) (release func(), err error) {
	s, err := qemustate.PrepareDeviceState(ctx, mon, t.Paths.DevState, devStateFD, ramAlias, ram.Mode != sharedmem.Stream, migrationPoll, mon.log)
	if err != nil {
		return nil, err
	}
	r.SaveDeviceState = s.Save
	if s.DevicesOnly {
		t.Manifest.DevStateFormat = vmfork.DevStateDevices
	} else {
		// A migration's end is reported before QEMU leaves finish-migrate.
		r.QMP = mon
	}
	return s.Release, nil
}

func suspend(ctx context.Context, dom *libvirt.Domain) error {
	_, err := call(ctx, dom, func(d *libvirt.Domain) (struct{}, error) { return struct{}{}, d.Suspend() })
	return named("virDomainSuspend", err)
}

func resume(ctx context.Context, dom *libvirt.Domain) error {
	_, err := call(ctx, dom, func(d *libvirt.Domain) (struct{}, error) { return struct{}{}, d.Resume() })
	return named("virDomainResume", err)
}

// freezePrep is what a freeze prepares and checks before pausing the source.
type freezePrep struct {
	ram        string   // the source's RAM file, as QEMU reports it
	shared     bool     // whether it is mapped shared, so children can map a copy
	owner      string   // the DAC label QEMU runs as, "+UID:+GID"
	diskTarget string   // the source's disk (vda), or "" without one
	otherDisks []string // its read-only and shareable disks, left as they are
	// foreign is set when the source's disk is not vmfork's but its owner's
	// (an adopted domain's own image): the template has it already, and it
	// stays the base of the source's new overlay where it is.
	foreign bool
	next    string // the source's next top overlay, made ahead
	// extras are the extra disks switched with it (disks.go).
	extras []extraSwitch
	// chainLen is the source disk's chain before the switch (its top
	// included); snapshotMS the time of libvirt's snapshot call in the
	// pause. Both for the debug log.
	chainLen   int
	snapshotMS float64
	cleanup    func()
}

func (d *Driver) prepareFreeze(ctx context.Context, dom *libvirt.Domain, mon monitor, src *vmfork.Machine, t *vmfork.Template) (p *freezePrep, err error) {
	p = &freezePrep{cleanup: func() {}}
	_, live, err := liveXML(ctx, dom, 0)
	if err != nil {
		return nil, err
	}
	if err := Check(live); err != nil {
		return nil, err
	}
	migXML, mig, err := liveXML(ctx, dom, libvirt.DOMAIN_XML_MIGRATABLE)
	if err != nil {
		return nil, err
	}
	if err := qemustate.PrepareSave(ctx, mon); errors.Is(err, qemustate.ErrMigrationBlocked) {
		return nil, fmt.Errorf("%w: %w", err, vmfork.ErrUnsupported)
	} else if err != nil {
		return nil, err
	}
	if err := mon.Execute(ctx, "qom-get", map[string]string{"path": "/objects/" + ramAlias, "property": "mem-path"}, &p.ram); err != nil {
		return nil, fmt.Errorf("find guest RAM file: %w", err)
	}
	p.owner = dacLabel(live)
	if uid, gid, ok := parseDACLabel(p.owner); ok && qemuIsOther(uid, gid) {
		// An adopted domain's QEMU runs as libvirt's own user: it must reach
		// its new overlay, and its children their backing file through the
		// template's directory.
		if err := grantSearch(stateDirOf(src.Paths.Dir), uid, gid, src.Paths.Dir, t.Paths.Dir); err != nil {
			return nil, err
		}
	}
	if t.Manifest, err = d.manifest(src, mig); err != nil {
		return nil, err
	}
	mb := live.MemoryBacking
	p.shared = mb.MemoryAccess != nil && mb.MemoryAccess.Mode == "shared"
	t.Manifest.RAMSharedWithChildren = p.shared
	if t.VMGenID, err = qmp.QueryVMGenerationID(ctx, mon); err != nil {
		return nil, fmt.Errorf("query vmgenid: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(t.Paths.Dir, FileSourceXML), []byte(migXML), 0o600); err != nil {
		return nil, fmt.Errorf("save source domain XML: %w", err)
	}
	if src.Spec.Disk != "" {
		if err := prepareDisk(ctx, live, src, t, p); err != nil {
			return nil, err
		}
		if err := prepareExtraDisks(ctx, live, src, t, p); err != nil {
			p.cleanup()
			return nil, err
		}
	}
	return p, nil
}

// prepareDisk makes the source's next top overlay on the template's name of
// its current top, before the pause.
func prepareDisk(ctx context.Context, live *libvirtxml.Domain, src *vmfork.Machine, t *vmfork.Template, p *freezePrep) error {
	for _, disk := range live.Devices.Disks {
		if disk.Source != nil && disk.Source.File != nil && filepath.Clean(disk.Source.File.File) == filepath.Clean(src.Paths.Disk) {
			p.diskTarget = diskName(&disk)
		} else {
			p.otherDisks = append(p.otherDisks, diskName(&disk))
		}
	}
	if p.diskTarget == "" {
		return fmt.Errorf("domain %q has no disk %s", src.Name, src.Paths.Disk)
	}
	chain, err := overlay.Chain(src.Paths.Disk)
	if err != nil {
		return err
	}
	p.chainLen = len(chain)
	if p.next, err = overlay.NextTop(src.Paths.Dir); err != nil {
		return err
	}
	backing := t.Paths.Disk
	if !within(src.Paths.Dir, src.Paths.Disk) {
		if err := freezeForeign(src.Paths.Disk, t); err != nil {
			return err
		}
		// The owner's image stays where it is and is never removed, so
		// the source's chain names it there: dropping the template later
		// then copies nothing of it.
		p.foreign, backing = true, src.Paths.Disk
	}
	if err := overlay.CreateOn(ctx, backing, chain[0].Format, chain[0].VirtualSize, p.next); err != nil {
		return err
	}
	p.cleanup = func() {
		if src.Paths.Disk != p.next { // not switched: the overlays are unused
			os.Remove(p.next)
			for _, x := range p.extras {
				os.Remove(x.next)
			}
		}
	}
	return nil
}

// switchDisk makes the source's current top the template's frozen disk (a
// second name, a hard link: QEMU reopens images by the names it knows) and
// moves the source onto the overlay made for it, through a disk-only
// external snapshot that reuses that overlay and keeps no libvirt metadata.
func (d *Driver) switchDisk(ctx context.Context, dom *libvirt.Domain, src *vmfork.Machine, t *vmfork.Template, p *freezePrep, w *sharedmem.PauseWindow) error {
	if !p.foreign {
		if err := os.Link(src.Paths.Disk, t.Paths.Disk); err != nil {
			return err
		}
		w.OnFailure(func(context.Context) error { return os.Remove(t.Paths.Disk) })
	}
	disks := []libvirtxml.DomainSnapshotDisk{{
		Name:     p.diskTarget,
		Snapshot: "external",
		Driver:   &libvirtxml.DomainDiskDriver{Type: "qcow2"},
		Source:   &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: p.next}},
	}}
	extras, err := snapshotExtras(src, p, func(f func() error) { w.OnFailure(func(context.Context) error { return f() }) })
	if err != nil {
		return err
	}
	disks = append(disks, extras...)
	for _, name := range p.otherDisks {
		// Named so that the snapshot leaves them as they are, whatever
		// libvirt's default for an unnamed disk: children share them.
		disks = append(disks, libvirtxml.DomainSnapshotDisk{Name: name, Snapshot: "no"})
	}
	snap := &libvirtxml.DomainSnapshot{Disks: &libvirtxml.DomainSnapshotDisks{Disks: disks}}
	x, err := snap.Marshal()
	if err != nil {
		return err
	}
	flags := libvirt.DOMAIN_SNAPSHOT_CREATE_DISK_ONLY | libvirt.DOMAIN_SNAPSHOT_CREATE_NO_METADATA |
		libvirt.DOMAIN_SNAPSHOT_CREATE_ATOMIC | libvirt.DOMAIN_SNAPSHOT_CREATE_REUSE_EXT
	start := time.Now()
	defer func() { p.snapshotMS = float64(time.Since(start).Microseconds()) / 1000 }()
	if _, err := call(ctx, dom, func(d *libvirt.Domain) (struct{}, error) {
		s, err := d.CreateSnapshotXML(x, flags)
		if err == nil {
			s.Free()
		}
		return struct{}{}, err
	}); err != nil {
		return err
	}
	// From here the source writes to its new overlays, on top of the
	// frozen disks; that cannot be undone, and need not be: only resume
	// remains.
	src.Paths.Disk = p.next
	for _, x := range p.extras {
		src.Paths.Disks[x.id] = vmfork.DiskFile{File: x.next}
	}
	w.Keep()
	return nil
}

// dacLabel returns the "+UID:+GID" QEMU runs as, from a live definition.
func dacLabel(live *libvirtxml.Domain) string {
	for _, s := range live.SecLabel {
		if s.Model == "dac" && s.Label != "" {
			return s.Label
		}
	}
	return ""
}

// grantRAM lets the children's QEMU open the template: QEMU 7.2 opens a
// mem-path O_RDWR even to map it privately (readonly=on would make guest RAM
// a ROM), and libvirt drops CAP_DAC_OVERRIDE from a QEMU it runs as root, so
// the owner must be QEMU's user with read and write permission. The file is
// still never written: children map it MAP_PRIVATE.
func grantRAM(path, owner string) error {
	if uid, gid, ok := parseDACLabel(owner); ok && (uid != os.Geteuid() || gid != os.Getegid()) {
		if err := os.Chown(path, uid, gid); err != nil {
			return fmt.Errorf("template RAM: %w", err)
		}
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return fmt.Errorf("template RAM: %w", err)
	}
	return nil
}

// manifest describes what a template needs of the host that loads it.
func (d *Driver) manifest(m *vmfork.Machine, mig *libvirtxml.Domain) (vmfork.Manifest, error) {
	v, err := d.conn.GetVersion()
	if err != nil {
		return vmfork.Manifest{}, fmt.Errorf("QEMU version: %w", wrap(err))
	}
	mt := ""
	if mig.OS != nil && mig.OS.Type != nil {
		mt = mig.OS.Type.Machine
	}
	cpu := ""
	if mig.CPU != nil && mig.CPU.Model != nil {
		cpu = mig.CPU.Model.Value
	}
	return vmfork.Manifest{
		QEMUVersion: fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000),
		MachineType: mt,
		CPUModel:    cpu,
		MemoryMiB:   m.Spec.MemoryMiB,
		CPUs:        m.Spec.CPUs,
		Devices:     GuestVisible(mig),
	}, nil
}

// freezeForeign gives template t its frozen disk when that is the owner's
// image at path (an adopted domain's), without copying or moving it: a hard
// link in the template's directory, so that the children do not depend on
// the image keeping its name, or, where no link can be made (another file
// system) or would not work (a backing file named relative to the image's
// directory), the image where it is (Template.ForeignDisk). Either way
// vmfork never writes it, and never removes it: removing the template
// removes only the link.
func freezeForeign(path string, t *vmfork.Template) error {
	rel, err := relativeBacking(path)
	if err != nil {
		return err
	}
	if !rel {
		err := os.Link(path, t.Paths.Disk)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EXDEV) && !errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("freeze disk: %w", err)
		}
	}
	t.Paths.Disk, t.ForeignDisk = path, true
	return nil
}
