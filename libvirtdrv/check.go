package libvirtdrv

import (
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
)

// Problem is one reason a domain cannot be forked, named by the XML element
// to change.
type Problem struct {
	// Element is the domain XML element as it is now, or as it is missing.
	Element string `json:"element"`
	// Why says what goes wrong with it in a fork.
	Why string `json:"why"`
	// Fix is the XML to put in its place.
	Fix string `json:"fix"`
}

func (p Problem) String() string { return fmt.Sprintf("%s: %s; %s", p.Element, p.Why, p.Fix) }

// UnforkableError says why a domain cannot be forked. It wraps
// vmfork.ErrUnsupported.
type UnforkableError struct {
	Domain   string
	Problems []Problem
}

func (e *UnforkableError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return fmt.Sprintf("domain %q cannot be forked: %s", e.Domain, strings.Join(parts, "; "))
}

func (e *UnforkableError) Unwrap() error { return vmfork.ErrUnsupported }

// Check reports what in domain d stops it from being forked (reference
// qemu-fork-mechanics.md §2-§4, libvirt-children.md §2): guest RAM must be one
// file (its children map their template file privately); nothing may punch
// holes in a template or need really shared memory in a child; and QEMU must
// be able to save every device's state. RAM mapped shared is frozen by
// copying the file; private RAM (a fork child's) is forkable too, but then
// the device state carries all of it. A child also needs what its identity
// comes from, a vmgenid device and the guest-agent channel, and writable
// disks that are files, to put its overlays on. It returns nil or an
// *UnforkableError naming every element to change, so one round of edits is
// enough.
func Check(d *libvirtxml.Domain) error {
	var ps []Problem
	add := func(el, why, fix string) { ps = append(ps, Problem{el, why, fix}) }
	mb := d.MemoryBacking
	switch {
	case mb == nil || mb.MemorySource == nil:
		add("<memoryBacking><source type='file'/>", "is missing: guest RAM is anonymous, so it cannot be frozen into a file",
			"add <memoryBacking><source type='file'/><access mode='shared'/></memoryBacking>")
	case mb.MemorySource.Type != "file":
		add(fmt.Sprintf("<memoryBacking><source type='%s'/>", mb.MemorySource.Type),
			"guest RAM is not a file (memfd and anonymous RAM arrive as zeros in a child with QEMU 7.2)",
			"use <source type='file'/>")
	}
	if mb != nil && mb.MemoryDiscard != nil {
		add("<memoryBacking><discard/>", "QEMU discards the RAM file's contents when it exits", "remove <discard/>")
	}
	if mb != nil && mb.MemoryHugePages != nil {
		add("<memoryBacking><hugepages/>", "a private mapping of a hugetlbfs template reserves the whole size in every child",
			"remove <hugepages/>")
	}
	if d.CPU != nil && d.CPU.Numa != nil && len(d.CPU.Numa.Cell) > 0 {
		add("<cpu><numa>", "guest RAM is split into one file per node", "remove <numa>")
	}
	if d.GenID == nil {
		add("<genid/>", "is missing: a child's kernel reseeds its RNG when it sees a new vmgenid, and the device state loads only into the same devices",
			"add <genid/> to <domain> (libvirt picks the GUID; it takes effect at the next start)")
	}
	if d.Devices != nil {
		checkDevices(d.Devices, add)
	} else {
		add("<devices><memballoon>", "is missing, so libvirt adds a virtio balloon, which punches holes in the template",
			"add <memballoon model='none'/>")
	}
	if d.Devices == nil || agentChannelOf(d.Devices) == nil {
		add("<channel><target type='virtio' name='"+agentChannel+"'/>",
			"is missing: vmfork gives each child its own identity (hostname, MAC, machine-id, clock) through the guest agent",
			"add <channel type='unix'><target type='virtio' name='"+agentChannel+"'/></channel> and run qemu-guest-agent in the guest")
	}
	if len(ps) == 0 {
		return nil
	}
	return &UnforkableError{Domain: d.Name, Problems: ps}
}

func checkDevices(dv *libvirtxml.DomainDeviceList, add func(el, why, fix string)) {
	switch {
	case dv.MemBalloon == nil:
		add("<memballoon>", "is missing, so libvirt adds a virtio balloon, which punches holes in the template",
			"add <memballoon model='none'/>")
	case dv.MemBalloon.Model != "none":
		add(fmt.Sprintf("<memballoon model='%s'>", dv.MemBalloon.Model),
			"a balloon in a child punches holes in the template file all its siblings map",
			"use <memballoon model='none'/>")
	}
	checkDisks(dv.Disks, add)
	for _, m := range dv.Memorydevs {
		add(fmt.Sprintf("<memory model='%s'>", m.Model), "memory devices unplug by punching holes in guest RAM", "remove it")
	}
	for _, h := range dv.Hostdevs {
		el := "<hostdev>"
		if h.SubsysPCI != nil {
			el = "<hostdev type='pci'>"
			// Name the device: a domain may pass several through.
			if src := h.SubsysPCI.Source; src != nil && src.Address != nil && src.Address.Bus != nil && src.Address.Slot != nil {
				a := src.Address
				el += fmt.Sprintf(" %04x:%02x:%02x.%x", deref(a.Domain), *a.Bus, *a.Slot, deref(a.Function))
			}
		}
		add(el, "QEMU 7.2 cannot save a passed-through device's state", "fork with --detach-devices, which unplugs it for the fork and plugs it back")
	}
	for _, s := range dv.Shmems {
		add(fmt.Sprintf("<shmem name='%s'>", s.Name), "ivshmem in peer mode blocks migration",
			"remove it, or fork with --detach-devices, which unplugs it for the fork and plugs it back")
	}
	for _, f := range dv.Filesystems {
		if f.Driver != nil && f.Driver.Type == "virtiofs" {
			add("<filesystem><driver type='virtiofs'/>", "virtiofs needs really shared memory, which a fork child does not have", "remove it")
		}
	}
	checkInterfaces(dv.Interfaces, add)
}

// checkDisks checks the writable disks: a child gets a qcow2 overlay on
// each of its source's writable disks, all frozen in the same snapshot at
// the fork, and that takes files. Read-only and shareable disks are handed
// to children as they are.
func checkDisks(disks []libvirtxml.DomainDisk, add func(el, why, fix string)) {
	for _, disk := range disks {
		if disk.Device == "cdrom" || disk.ReadOnly != nil || disk.Shareable != nil {
			continue
		}
		if t := diskType(&disk); t != "file" {
			add(fmt.Sprintf("<disk type='%s'> %s", t, diskName(&disk)),
				"only a file disk can be frozen for children and get an overlay",
				"use a file disk, or make it <readonly/> or <shareable/>, or detach it before the fork")
		}
	}
}

// diskType is the type attribute of a <disk>, which libvirtxml turns into
// the choice of source.
func diskType(disk *libvirtxml.DomainDisk) string {
	src := disk.Source
	switch {
	case src == nil:
		return "none"
	case src.File != nil:
		return "file"
	case src.Block != nil:
		return "block"
	case src.Network != nil:
		return "network"
	case src.Volume != nil:
		return "volume"
	case src.Dir != nil:
		return "dir"
	case src.NVME != nil:
		return "nvme"
	}
	return "other"
}

// agentChannelOf returns the guest agent's channel, or nil.
func agentChannelOf(dv *libvirtxml.DomainDeviceList) *libvirtxml.DomainChannel {
	for i, c := range dv.Channels {
		if c.Target != nil && c.Target.VirtIO != nil && c.Target.VirtIO.Name == agentChannel {
			return &dv.Channels[i]
		}
	}
	return nil
}
