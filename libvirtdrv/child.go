//go:build cgo

package libvirtdrv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/internal/brport"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/sharedmem"
)

// StartChild implements vmfork.Forker (reference libvirt-children.md §7): a
// transient domain from the source's XML, started paused with -incoming
// defer while the start hook links the template RAM to its RAM path; then
// x-ignore-shared, the device state through a passed fd, the NIC link down
// (the child wakes with its source's addresses) and resume, never before the
// load has completed.
func (d *Driver) StartChild(ctx context.Context, child *vmfork.Machine, t *vmfork.Template) error {
	return d.startChild(ctx, child, t, false)
}

// startChild is StartChild; loaded leaves the domain paused once its device
// state is in, records nothing and names no reaper in its metadata (fork
// --to's loaded template, live.go).
func (d *Driver) startChild(ctx context.Context, child *vmfork.Machine, t *vmfork.Template, loaded bool) (err error) {
	if !t.HasMemory {
		return fmt.Errorf("template %q holds no memory: %w", t.ID, vmfork.ErrInvalid)
	}
	srcXML, err := os.ReadFile(filepath.Join(t.Paths.Dir, FileSourceXML))
	if err != nil {
		return fmt.Errorf("template %q: %w", t.ID, err)
	}
	if err := vmfork.PickPorts(child.Spec.Ports); err != nil {
		return err
	}
	// A child maps a fresh RAM file of its own shared, which StartChild
	// remaps privately onto the template before the guest runs: its RAM
	// block is then share=on, so its own forks save no RAM in the device
	// state and copy only its private pages (sharedmem.Plan, Diff). Its
	// metadata names the template as MappedRAM, which no start hook links.
	remap := sharedmem.RemapSupported
	if err := checkDeltaChild(t, remap); err != nil {
		return err
	}
	md := d.metadata(child, t)
	if remap {
		md.MappedRAM, md.TemplateRAM = t.MappedRAM(), ""
	}
	if loaded {
		md.URI = "" // no machine of the store: nothing to reap
	}
	def, err := ChildXML(string(srcXML), child, md)
	if err != nil {
		return fmt.Errorf("template %q: %w", t.ID, err)
	}
	if remap {
		def.MemoryBacking.MemoryAccess = &libvirtxml.DomainMemoryAccess{Mode: "shared"}
	}
	if t.Manifest.DevStateFormat == vmfork.DevStateDevices {
		addDevicesOnlyArgs(def)
	}
	undoFilter, err := d.withContractFilter(ctx, child, def)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			undoFilter()
		}
	}()
	x, err := def.Marshal()
	if err != nil {
		return fmt.Errorf("domain XML: %w", err)
	}
	if err := d.checkNameFree(child); err != nil {
		return err
	}
	if err := reachForChild(child, t); err != nil {
		return err
	}
	// START_PAUSED is what keeps libvirt from sending cont at once, which
	// QEMU 7.2 would act on before the load (activating the disk early).
	if err := child.PrepareLedgerSocket(); err != nil {
		return err
	}
	flags := libvirt.DOMAIN_START_PAUSED
	if loaded {
		// libvirtd destroys it when this connection closes: it dies with
		// vmfork, as qemudrv's loaded QEMU does (PR_SET_PDEATHSIG).
		flags |= libvirt.DOMAIN_START_AUTODESTROY
	}
	dom, err := d.conn.DomainCreateXML(x, flags)
	if err != nil {
		return fmt.Errorf("create domain %q: %w", child.Name, wrap(err))
	}
	defer dom.Free()
	defer func() {
		if err != nil {
			d.destroy(dom)
			child.PID = 0
		}
	}()
	mon := d.monitor(dom, child)
	if remap {
		if err := d.mapTemplate(ctx, mon, child, t); err != nil {
			return err
		}
	}
	if err := d.checkChild(ctx, dom, mon, child, t, remap); err != nil {
		return err
	}
	// The one round of RARP frames QEMU sends as the load ends
	// (domainxml.go: migration.announce-rounds) carries the source's MAC:
	// the backend's link is down from before the load until SetLink
	// raises it, once the identity chain has run.
	if _, err := d.backendLink(ctx, dom, mon, false); err != nil {
		return err
	}
	if err := d.loadDeviceState(ctx, mon, t); err != nil {
		if tail := logTail(qemuLog(d.uri, child.Name, ""), 3); tail != "" {
			err = fmt.Errorf("%w: %s", err, tail)
		}
		return fmt.Errorf("load device state: %w", err)
	}
	if err := d.setLink(ctx, dom, false); err != nil {
		return fmt.Errorf("set link down: %w", err)
	}
	if loaded {
		return nil
	}
	if err := d.started(ctx, dom, child); err != nil {
		return err
	}
	if err := resume(ctx, dom); err != nil {
		return fmt.Errorf("resume child: %w", err)
	}
	return nil
}

var _ vmfork.InPlaceStarter = (*Driver)(nil)

// StartInPlace implements vmfork.InPlaceStarter (rewind, resume). Every
// domain this driver makes is transient: once the machine's QEMU has ended
// (a rewind stops it first; a hibernate ended it) libvirt has forgotten the
// domain and its name is free, so the new process is a child domain of t
// under the machine's own name, with the record's files, MAC and ports.
// checkNameFree refuses it while a domain of that name still runs.
func (d *Driver) StartInPlace(ctx context.Context, m *vmfork.Machine, t *vmfork.Template) error {
	return d.StartChild(ctx, m, t)
}

// reachForChild lets the child's QEMU open its overlay when it runs as
// another user than vmfork (an adopted domain's child, as libvirt's own
// user): Freeze gave the template RAM file to the user the source's QEMU ran
// as, and the child's QEMU runs as that user too.
func reachForChild(child *vmfork.Machine, t *vmfork.Template) error {
	st, err := os.Stat(t.MappedRAM())
	if err != nil {
		return fmt.Errorf("template %q: %w", t.ID, err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || !qemuIsOther(int(sys.Uid), int(sys.Gid)) {
		return nil
	}
	return grantSearch(stateDirOf(child.Paths.Dir), int(sys.Uid), int(sys.Gid), child.Paths.Dir, t.Paths.Dir)
}

// mapTemplate remaps the RAM of child's starting QEMU (paused, -incoming
// defer, its guest never run) privately onto template t's RAM file, or onto
// a delta template's base with the delta's pages written over it (delta.go).
func (d *Driver) mapTemplate(ctx context.Context, mon monitor, child *vmfork.Machine, t *vmfork.Template) error {
	var ram string
	if err := mon.Execute(ctx, "qom-get", map[string]string{"path": "/objects/" + ramAlias, "property": "mem-path"}, &ram); err != nil {
		return fmt.Errorf("find guest RAM file: %w", err)
	}
	pid := qemuPID(d.uri, child.Name)
	if pid == 0 {
		return fmt.Errorf("machine %q: no QEMU pid in libvirt's run dir", child.Name)
	}
	return mapTemplateRAM(ctx, mon, pid, ram, t)
}

// checkChild checks, before anything is loaded, that the child's QEMU maps
// the template (a child whose start hook did not run, or whose remap did
// not take, would run on zeroed RAM and crash in ways nobody could trace
// back) and that its guest-visible configuration is the template's.
func (d *Driver) checkChild(ctx context.Context, dom *libvirt.Domain, mon monitor, child *vmfork.Machine, t *vmfork.Template, remapped bool) error {
	if remapped {
		if err := sharedmem.MapsTemplate(qemuPID(d.uri, child.Name), t.MappedRAM(), int64(t.Manifest.MemoryMiB)<<20); err != nil {
			return fmt.Errorf("guest RAM of %q is not the template's %s: %w", child.Name, t.MappedRAM(), err)
		}
	} else {
		var ram string
		if err := mon.Execute(ctx, "qom-get", map[string]string{"path": "/objects/" + ramAlias, "property": "mem-path"}, &ram); err != nil {
			return fmt.Errorf("find guest RAM file: %w", err)
		}
		if !linkedTo(ram, t.Paths.RAM) {
			return fmt.Errorf("guest RAM %s is not the template's %s: the vmfork start hook did not run (run `vmfork libvirt setup`)", ram, t.Paths.RAM)
		}
	}
	_, mig, err := liveXML(ctx, dom, libvirt.DOMAIN_XML_MIGRATABLE)
	if err != nil {
		return err
	}
	got, err := d.manifest(&vmfork.Machine{Spec: vmfork.Spec{MemoryMiB: t.Manifest.MemoryMiB, CPUs: t.Manifest.CPUs}}, mig)
	if err != nil {
		return err
	}
	got.DevStateBytes, got.RAMSharedWithChildren = t.Manifest.DevStateBytes, t.Manifest.RAMSharedWithChildren
	got.DevStateFormat = t.Manifest.DevStateFormat
	return got.Check(t.Manifest)
}

// loadDeviceState sets x-ignore-shared right before the load: unlike the
// embedded driver, this one keeps no QEMU prepared ahead (no warm pool).
func (d *Driver) loadDeviceState(ctx context.Context, mon monitor, t *vmfork.Template) error {
	if err := qemustate.SetIgnoreShared(ctx, mon); err != nil {
		return err
	}
	return qemustate.LoadDeviceState(ctx, mon, devStateFD, t.Paths.DevState, migrationPoll, mon.log)
}

// Resume implements vmfork.Forker.
func (d *Driver) Resume(ctx context.Context, m *vmfork.Machine) error {
	dom, err := d.domain(m)
	if err != nil || dom == nil {
		return err
	}
	defer dom.Free()
	st, _, err := dom.GetState()
	if err != nil {
		return fmt.Errorf("domain %q state: %w", m.Name, wrap(err))
	}
	if st != libvirt.DOMAIN_PAUSED {
		return nil
	}
	return resume(ctx, dom)
}

// SetLink implements vmfork.LinkSetter through libvirt's device update, so
// `virsh domif-getlink` tells the truth.
func (d *Driver) SetLink(ctx context.Context, m *vmfork.Machine, up bool) error {
	dom, err := d.domain(m)
	if err != nil {
		return fmt.Errorf("set link: %w", err)
	}
	if dom == nil {
		return fmt.Errorf("set link: machine %q: %w", m.Name, vmfork.ErrNotRunning)
	}
	defer dom.Free()
	if err := d.setLink(ctx, dom, up); err != nil {
		return fmt.Errorf("set link: %w", err)
	}
	if up {
		if _, err := d.backendLink(ctx, dom, d.monitor(dom, m), true); err != nil {
			return fmt.Errorf("set link: %w", err)
		}
	}
	return nil
}

// backendLink sets the link of the first interface's backend (libvirt's
// netdev "host" + the interface's alias) over QMP, where libvirt has no
// call for it: its link state is the NIC's, and a NIC's link does not stop
// what QEMU queued before it went down. It returns the netdev's id, "" for
// a domain without an interface (nothing to announce, nothing set).
func (d *Driver) backendLink(ctx context.Context, dom *libvirt.Domain, mon monitor, up bool) (string, error) {
	_, live, err := liveXML(ctx, dom, 0)
	if err != nil {
		return "", err
	}
	if live.Devices == nil || len(live.Devices.Interfaces) == 0 {
		return "", nil
	}
	alias := "net0"
	if a := live.Devices.Interfaces[0].Alias; a != nil && a.Name != "" {
		alias = a.Name
	}
	id := "host" + alias
	if err := mon.Execute(ctx, "set_link", map[string]any{"name": id, "up": up}, nil); err != nil {
		return "", fmt.Errorf("set backend %s link up=%v: %w", id, up, err)
	}
	return id, nil
}

func (d *Driver) setLink(ctx context.Context, dom *libvirt.Domain, up bool) error {
	_, live, err := liveXML(ctx, dom, 0)
	if err != nil {
		return err
	}
	if live.Devices == nil || len(live.Devices.Interfaces) == 0 {
		return fmt.Errorf("domain %q has no <interface>", live.Name)
	}
	ifc := live.Devices.Interfaces[0]
	ifc.Link = &libvirtxml.DomainInterfaceLink{State: "down"}
	if up {
		ifc.Link.State = "up"
		// On a bridge that runs STP (libvirt's default network has it
		// on) a new tap forwards only after 4 s: the guest's first DHCP
		// packets would be lost (internal/brport). The tap is this
		// host's only where the daemon is.
		if isLocalSystem(d.uri) && ifc.Target != nil && ifc.Target.Dev != "" {
			brport.WaitForwarding(ctx, ifc.Target.Dev)
		}
	}
	x, err := ifc.Marshal()
	if err != nil {
		return err
	}
	_, err = call(ctx, dom, func(d *libvirt.Domain) (struct{}, error) {
		return struct{}{}, d.UpdateDeviceFlags(x, libvirt.DOMAIN_DEVICE_MODIFY_LIVE)
	})
	return err
}

// CheckDomain reports whether the libvirt domain called name (any domain, not
// only vmfork's) can be forked: nil, or an *UnforkableError naming every XML
// element to change. It reads the live definition of a running domain and
// the persistent one otherwise.
func (d *Driver) CheckDomain(ctx context.Context, name string) error {
	dom, err := d.conn.LookupDomainByName(name)
	if errors.Is(err, libvirt.ERR_NO_DOMAIN) {
		return fmt.Errorf("libvirt domain %q: %w", name, vmfork.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("look up domain %q: %w", name, wrap(err))
	}
	defer dom.Free()
	_, def, err := liveXML(ctx, dom, 0)
	if err != nil {
		return err
	}
	return Check(def)
}

// logTail returns the last n lines of a QEMU log joined into one line.
func logTail(path string, n int) string {
	if path == "" {
		return ""
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// reapWait bounds how long WaitDomainGone waits for libvirt to forget a domain.
const reapWait = 2 * time.Minute

// WaitDomainGone returns once libvirt has forgotten domain uuid (fork child
// name), or an error after reapWait. The release hook cannot call libvirt
// itself, so `vmfork libvirt reap`, started detached, waits here before
// Manager.RemoveEnded removes the child from the store: a child destroyed
// with `virsh destroy` then leaves nothing behind.
func (d *Driver) WaitDomainGone(ctx context.Context, name, uuid string) error {
	ctx, cancel := context.WithTimeout(ctx, reapWait)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		dom, err := d.conn.LookupDomainByUUIDString(uuid)
		if errors.Is(err, libvirt.ERR_NO_DOMAIN) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reap %q: %w", name, wrap(err))
		}
		dom.Free()
		select {
		case <-ctx.Done():
			return fmt.Errorf("reap %q: domain %s still exists: %w", name, uuid, ctx.Err())
		case <-t.C:
		}
	}
}
