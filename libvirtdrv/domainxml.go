package libvirtdrv

import (
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/profile"
)

// Fixed names in the domains vmfork defines. The agent channel's name is what
// qemu-ga in the guest looks for; the RAM alias is where libvirt 9.0 puts a
// pc/q35 guest's RAM file, <memory_backing_dir>/<id>-<name[:20]>/pc.ram.
const (
	agentChannel  = profile.AgentChannel
	ledgerChannel = profile.LedgerChannel
	ramAlias      = profile.RAMBlock
	// tbCacheMiB bounds TCG's translation cache: QEMU 7.2 reserves 1 GiB per
	// process by default, which a fork child would pay for again.
	tbCacheMiB = 128
)

// Domain types.
const (
	domainKVM  = "kvm"
	domainTCG  = "qemu"
	accelKVM   = profile.AccelKVM
	accelTCG   = profile.AccelTCG
	domainArch = "x86_64"
)

// BootOptions are the per-host choices of a booted domain that are not in the
// machine's record.
type BootOptions struct {
	// User is the DAC label QEMU runs as, "+UID:+GID". vmfork's state and mem
	// dirs are private to the user running vmfork, so its domains run QEMU as
	// that user, as the embedded driver does, and libvirt relabels nothing.
	User string
}

// BootXML returns the domain of machine m as vmfork boots it: the embedded
// driver's device model in libvirt terms, with guest RAM in a shared file
// (forkable), no balloon (it would punch holes in templates), a vmgenid, the
// guest agent channel and a pty serial console logged to the machine's
// serial.log, so `virsh console` works. The record must be resolved:
// Spec.MachineType, Spec.CPUModel, Spec.MAC and Accel set.
func BootXML(m *vmfork.Machine, md Metadata, opt BootOptions) *libvirtxml.Domain {
	s := m.Spec
	d := &libvirtxml.Domain{
		Type:          domainTCG,
		Name:          m.Name,
		GenID:         &libvirtxml.DomainGenID{Value: m.VMGenID},
		Memory:        &libvirtxml.DomainMemory{Value: uint(s.MemoryMiB), Unit: "MiB"},
		MemoryBacking: sharedFileRAM(),
		VCPU:          &libvirtxml.DomainVCPU{Value: uint(s.CPUs)},
		OS: &libvirtxml.DomainOS{
			Type:    &libvirtxml.DomainOSType{Arch: domainArch, Machine: s.MachineType, Type: "hvm"},
			Kernel:  s.Kernel,
			Initrd:  s.Initrd,
			Cmdline: s.Append,
		},
		Features: &libvirtxml.DomainFeatureList{
			// ACPI carries the vmgenid notification and the power button.
			ACPI: &libvirtxml.DomainFeature{},
			APIC: &libvirtxml.DomainFeatureAPIC{},
		},
		CPU: &libvirtxml.DomainCPU{
			Mode:  "custom",
			Match: "exact",
			Model: &libvirtxml.DomainCPUModel{Value: s.CPUModel, Fallback: "forbid"},
		},
		Clock:      &libvirtxml.DomainClock{Offset: "utc"},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices:    bootDevices(m),
		SecLabel:   secLabel(opt.User),
	}
	setMetadata(d, md)
	if m.Accel == accelKVM {
		d.Type = domainKVM
	} else {
		d.Features.TCG = &libvirtxml.DomainFeatureTCG{
			TBCache: &libvirtxml.DomainFeatureTCGTBCache{Unit: "MiB", Size: tbCacheMiB},
		}
	}
	return d
}

func sharedFileRAM() *libvirtxml.DomainMemoryBacking {
	return &libvirtxml.DomainMemoryBacking{
		MemorySource: &libvirtxml.DomainMemorySource{Type: "file"},
		MemoryAccess: &libvirtxml.DomainMemoryAccess{Mode: "shared"},
	}
}

func secLabel(user string) []libvirtxml.DomainSecLabel {
	if user == "" {
		return nil
	}
	return []libvirtxml.DomainSecLabel{{Type: "static", Model: "dac", Relabel: "no", Label: user}}
}

// bootMAC is the MAC a booting domain's NIC gets: a fork child's own (its
// identity chain gave its guest that one; vmfork start boots it again with
// it), else the record's.
func bootMAC(m *vmfork.Machine) string {
	if m.GuestMAC != "" {
		return m.GuestMAC
	}
	return m.Spec.MAC
}

func bootDevices(m *vmfork.Machine) *libvirtxml.DomainDeviceList {
	zero := uint(0)
	dev := &libvirtxml.DomainDeviceList{
		// No USB controller: nothing uses it, and every device is one more
		// section a child must match.
		Controllers: []libvirtxml.DomainController{{Type: "usb", Model: "none"}},
		Interfaces: []libvirtxml.DomainInterface{{
			MAC:    &libvirtxml.DomainInterfaceMAC{Address: bootMAC(m)},
			Source: interfaceSource(m.Spec.Network),
			Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
		}},
		Serials: []libvirtxml.DomainSerial{{
			Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
			Target: &libvirtxml.DomainSerialTarget{Port: &zero},
			Log:    &libvirtxml.DomainChardevLog{File: m.Paths.Serial, Append: "on"},
		}},
		Consoles: []libvirtxml.DomainConsole{{
			Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
			Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &zero},
		}},
		Channels: []libvirtxml.DomainChannel{{
			Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
			Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: agentChannel}},
		}},
		MemBalloon: &libvirtxml.DomainMemBalloon{Model: "none"},
	}
	if sock := m.LedgerSocket(); sock != "" {
		// The family ledger's port (package ledger): after the agent's, on
		// the same virtio-serial bus, as the embedded driver declares it.
		// QEMU binds the socket; the ledger server connects to it.
		dev.Channels = append(dev.Channels, ledgerChannelOf(sock))
	}
	if m.Spec.Disk != "" {
		dev.Disks = []libvirtxml.DomainDisk{{
			Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "qcow2"},
			Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: m.Paths.Disk}},
			Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
		}}
		dev.Disks = append(dev.Disks, extraBootDisks(m)...)
	}
	return dev
}

// extraBootDisks are m's extra disks (vmfork.DiskSpec) as a booted domain
// has them: after the boot disk in the spec's order (vdb, vdc, ...), so
// that libvirt gives them the same PCI slots in every machine booted from
// the record, each with its id as the disk's serial. The serial is what
// ties a <disk> back to its id in a fork child's XML (childDisks): the
// target names of an operator's domain are its disks' ids, but a booted
// domain's ids are the user's. The guest sees it too
// (/dev/disk/by-id/virtio-ID). Read-only is a backend choice, as on the
// embedded driver: a disk shared at boot, or shared by the fork that made
// this machine.
func extraBootDisks(m *vmfork.Machine) []libvirtxml.DomainDisk {
	var out []libvirtxml.DomainDisk
	for i, d := range m.Spec.Disks {
		f := m.Paths.Disks[d.ID]
		disk := libvirtxml.DomainDisk{
			Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "qcow2"},
			Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: f.File}},
			Target: &libvirtxml.DomainDiskTarget{Dev: extraTarget(i), Bus: "virtio"},
			Serial: d.ID,
		}
		if f.Format != "" {
			disk.Driver.Type = f.Format
		}
		if f.ReadOnly {
			disk.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
		}
		out = append(out, disk)
	}
	return out
}

// extraTarget is the target of a booted domain's i-th extra disk: vdb,
// vdc, ..., vdz, vdaa, ... (libvirt's own naming after vdz).
func extraTarget(i int) string {
	n := i + 1 // vda is the boot disk
	name := ""
	for {
		name = string(rune('a'+n%26)) + name
		n = n/26 - 1
		if n < 0 {
			break
		}
	}
	return "vd" + name
}

// ChildXML returns the domain of fork child c, derived from its source's
// migratable XML (saved with the template), changing only what may differ
// between the two (reference libvirt-children.md §6): name and uuid, the
// metadata, private RAM access, the MAC, a fresh or given vmgenid, the disk
// overlay, the serial log, generated socket paths and -incoming defer.
// Everything else, down to PCI addresses and the versioned machine type,
// stays as the source had it, which loading its device state requires.
func ChildXML(sourceXML string, c *vmfork.Machine, md Metadata) (*libvirtxml.Domain, error) {
	d := &libvirtxml.Domain{}
	if err := d.Unmarshal(sourceXML); err != nil {
		return nil, fmt.Errorf("parse source domain XML: %w", err)
	}
	if d.MemoryBacking == nil || d.MemoryBacking.MemorySource == nil || d.MemoryBacking.MemorySource.Type != "file" {
		return nil, fmt.Errorf("source domain XML has no file-backed <memoryBacking>")
	}
	d.Name, d.UUID, d.ID = c.Name, "", nil
	setMetadata(d, md)
	// An empty <genid/> makes libvirt choose a new GUID: the guest then
	// reseeds its RNG (the GUID is not migrated).
	d.GenID = &libvirtxml.DomainGenID{Value: c.VMGenID}
	d.MemoryBacking.MemoryAccess = &libvirtxml.DomainMemoryAccess{Mode: "private"}
	for i := range d.SecLabel {
		if d.SecLabel[i].Type == "dynamic" {
			d.SecLabel[i].Label, d.SecLabel[i].ImageLabel = "", ""
		}
	}
	if d.Devices == nil {
		return nil, fmt.Errorf("source domain XML has no <devices>")
	}
	if err := childDisks(d.Devices, c); err != nil {
		return nil, err
	}
	childInterfaces(d.Devices.Interfaces, c)
	for i := range d.Devices.Serials {
		s := &d.Devices.Serials[i]
		if s.Source != nil && s.Source.Pty != nil {
			s.Source.Pty.Path = ""
		}
		if i == 0 && c.Paths.Serial != "" {
			s.Log = &libvirtxml.DomainChardevLog{File: c.Paths.Serial, Append: "on"}
		}
	}
	for i := range d.Devices.Consoles {
		con := &d.Devices.Consoles[i]
		if con.Source != nil && con.Source.Pty != nil {
			con.Source.Pty.Path = ""
		}
		con.TTY = ""
		// libvirt shows the serial console's log on <console> too.
		if con.Log != nil && c.Paths.Serial != "" {
			con.Log = &libvirtxml.DomainChardevLog{File: c.Paths.Serial, Append: "on"}
		}
	}
	for i := range d.Devices.Channels {
		ch := &d.Devices.Channels[i]
		if s := ch.Source; s != nil && s.UNIX != nil {
			s.UNIX.Path = "" // libvirt makes one per domain
			if isLedger(ch) {
				// The ledger server finds it in the child's own directory.
				s.UNIX.Path = c.LedgerSocket()
			}
		}
		if t := ch.Target; t != nil && t.VirtIO != nil {
			t.VirtIO.State = ""
		}
	}
	if d.QEMUCommandline == nil {
		d.QEMUCommandline = &libvirtxml.DomainQEMUCommandline{}
	}
	// libvirt 9.0 cannot start a domain waiting for an incoming stream on
	// its own; QEMU 7.2 cannot set x-ignore-shared on its command line, so
	// the stream is loaded later over QMP (reference §9).
	d.QEMUCommandline.Args = append(d.QEMUCommandline.Args,
		// After the load QEMU announces the NIC with RARP frames and has
		// the guest announce the source's addresses: on a shared network
		// that steals the source's traffic (network.go). One round, not
		// none: with 0 QEMU 7.2's virtio-net frees its announce timer at
		// the load and segfaults at the guest's next reset (power-off,
		// reboot; docs/RELIABILITY.md). The round goes nowhere: the
		// backend's link is down over the load and the NIC's before the
		// guest runs (child.go), until the identity chain has run.
		libvirtxml.DomainQEMUCommandlineArg{Value: "-global"}, libvirtxml.DomainQEMUCommandlineArg{Value: "migration.announce-rounds=1"},
		libvirtxml.DomainQEMUCommandlineArg{Value: "-incoming"}, libvirtxml.DomainQEMUCommandlineArg{Value: "defer"})
	return d, nil
}

// ledgerChannelOf is the family ledger's channel, its socket at sock.
func ledgerChannelOf(sock string) libvirtxml.DomainChannel {
	return libvirtxml.DomainChannel{
		Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: sock}},
		Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: ledgerChannel}},
	}
}

// isLedger reports whether ch is the family ledger's channel.
func isLedger(ch *libvirtxml.DomainChannel) bool {
	return ch.Target != nil && ch.Target.VirtIO != nil && ch.Target.VirtIO.Name == ledgerChannel
}

func diskName(d *libvirtxml.DomainDisk) string {
	if d.Target != nil {
		return d.Target.Dev
	}
	return "?"
}

// GuestVisible lists what the guest of domain d can see, one line per item:
// machine type, CPU, memory, direct-boot files and every device with its bus
// address. A child must match its source's list exactly; backends (files,
// sockets, MACs, the vmgenid GUID) may differ. Templates keep it in their
// manifest, so a child on a changed host fails with the item named.
func GuestVisible(d *libvirtxml.Domain) []string {
	var out []string
	add := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	if d.OS != nil && d.OS.Type != nil {
		add("machine %s %s", d.OS.Type.Arch, d.OS.Type.Machine)
		if d.OS.Kernel != "" {
			add("kernel %s initrd %s cmdline %q", d.OS.Kernel, d.OS.Initrd, d.OS.Cmdline)
		}
	}
	if d.CPU != nil && d.CPU.Model != nil {
		add("cpu %s %s", d.CPU.Mode, d.CPU.Model.Value)
	}
	if d.Memory != nil {
		add("memory %d %s", d.Memory.Value, d.Memory.Unit)
	}
	if d.VCPU != nil {
		add("vcpus %d", d.VCPU.Value)
	}
	if d.GenID != nil {
		add("vmgenid")
	}
	if d.Devices == nil {
		return out
	}
	dv := d.Devices
	for _, x := range dv.Disks {
		add("disk %s %s %s", x.Device, diskName(&x), address(x.Address))
	}
	for _, x := range dv.Controllers {
		idx := "-"
		if x.Index != nil {
			idx = fmt.Sprint(*x.Index)
		}
		add("controller %s %s %s %s", x.Type, idx, x.Model, address(x.Address))
	}
	for _, x := range dv.Interfaces {
		model := ""
		if x.Model != nil {
			model = x.Model.Type
		}
		add("interface %s %s", model, address(x.Address))
	}
	for _, x := range dv.Serials {
		add("serial %s", address(x.Address))
	}
	for _, x := range dv.Channels {
		name := ""
		if x.Target != nil && x.Target.VirtIO != nil {
			name = x.Target.VirtIO.Name
		}
		add("channel %s %s", name, address(x.Address))
	}
	for _, x := range dv.Inputs {
		add("input %s %s %s", x.Type, x.Bus, address(x.Address))
	}
	for _, x := range dv.Videos {
		if x.Model.Type != "" {
			add("video %s %s", x.Model.Type, address(x.Address))
		}
	}
	for _, x := range dv.Hostdevs {
		add("hostdev %s", address(x.Address))
	}
	if dv.MemBalloon != nil {
		add("memballoon %s %s", dv.MemBalloon.Model, address(dv.MemBalloon.Address))
	}
	return out
}

func address(a *libvirtxml.DomainAddress) string {
	switch {
	case a == nil:
		return "-"
	case a.PCI != nil:
		p := a.PCI
		return fmt.Sprintf("pci %04x:%02x:%02x.%x", deref(p.Domain), deref(p.Bus), deref(p.Slot), deref(p.Function))
	case a.VirtioSerial != nil:
		v := a.VirtioSerial
		return fmt.Sprintf("virtio-serial %d.%d.%d", deref(v.Controller), deref(v.Bus), deref(v.Port))
	case a.Drive != nil:
		v := a.Drive
		return fmt.Sprintf("drive %d.%d.%d", deref(v.Controller), deref(v.Bus), deref(v.Unit))
	}
	return "other"
}

func deref(p *uint) uint {
	if p == nil {
		return 0
	}
	return *p
}

// ramFile is where libvirt 9.0 tells QEMU to keep the guest RAM of domain
// name with id under memory-backing directory dir: a directory named by
// virDomainDefGetShortName ("%d-%.20s") holding one file per RAM alias.
func ramFile(dir string, id int, name string) string {
	short := name
	if len(short) > 20 {
		short = short[:20]
	}
	return strings.Join([]string{dir, fmt.Sprintf("%d-%s", id, short), ramAlias}, "/")
}
