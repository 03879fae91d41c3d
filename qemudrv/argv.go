package qemudrv

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/profile"
	"github.com/vmfork/vmfork/qemustate"
)

// Fixed ids of the devices and objects every machine has. Device ids and PCI
// placement are part of the migration stream's section names, so parents and
// children must agree on them; backends (sockets, files, ports) may differ.
const (
	ramID      = profile.RAMBlock
	nicRootID  = "rp1" // the NIC sits on a root port so it can be hot-swapped
	spareRoot  = "rp2" // a free hot-plug slot (e.g. for a passthrough device)
	diskNodeID = "fmt0"
	nicID      = "nic0"
	netdevID   = "net0"
	qgaID      = "qga0"
	ledgerID   = "ledger0"
	serialID   = "serial0"
	agentPort  = profile.AgentChannel
	ledgerPort = profile.LedgerChannel
)

// Names of extra disk id's nodes and device (vmfork.DiskSpec).
func extraFileNode(id string) string { return "xfile-" + id }
func extraNode(id string) string     { return "xfmt-" + id }
func extraDevice(id string) string   { return "vd-" + id }

// Accelerators.
const (
	AccelKVM = profile.AccelKVM
	AccelTCG = profile.AccelTCG
)

// ArgvOptions are the per-process choices that are not part of the machine's
// device configuration.
type ArgvOptions struct {
	// Incoming starts QEMU with -incoming defer, to load device state over QMP.
	Incoming bool
	// DevicesOnly, with Incoming, readies QEMU for a device state saved
	// without a migration (qemustate.SaveDevices): its template's DevStateFormat.
	DevicesOnly bool
	// Paused, with Incoming, keeps the loaded VM paused (-S) however the
	// stream ends: a child that arrives by postcopy migration (live.go) is
	// resumed by vmfork once its link is down.
	Paused bool
}

// Argv returns the QEMU arguments (without the binary) for machine m. The
// record must be complete: Spec.MachineType, Spec.CPUModel, Spec.MAC, Accel
// and Paths set.
func Argv(m *vmfork.Machine, opt ArgvOptions) []string {
	var a []string
	add := func(s ...string) { a = append(a, s...) }
	s := m.Spec

	add("-name", "guest="+m.Name)
	add("-machine", s.MachineType+",memory-backend="+ramID)
	add("-accel", accelArg(m.Accel))
	add("-cpu", s.CPUModel, "-smp", fmt.Sprint(s.CPUs), "-m", fmt.Sprintf("%dM", s.MemoryMiB))
	add("-object", ramObject(m))
	add("-nodefaults", "-no-user-config", "-display", "none")
	// The seccomp filter libvirt gives its QEMUs: no obsolete system calls,
	// no setuid, no fork or exec, no scheduler or resource changes. The
	// embedded driver needs none of them: migration streams go through
	// passed descriptors (fd:, never exec:) and the tap comes ready-made.
	add("-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
	add("-chardev", "file,id="+serialID+",path="+optPath(m.Paths.Serial), "-serial", "chardev:"+serialID)
	add("-qmp", "unix:"+optPath(m.Paths.QMP)+",server=on,wait=off")
	if s.Kernel != "" {
		add("-kernel", s.Kernel)
		if s.Initrd != "" {
			add("-initrd", s.Initrd)
		}
		if s.Append != "" {
			add("-append", s.Append)
		}
	}
	add("-device", "pcie-root-port,id="+nicRootID+",bus=pcie.0,chassis=1,addr=0x3")
	add("-device", "pcie-root-port,id="+spareRoot+",bus=pcie.0,chassis=2,addr=0x4")
	if s.Disk != "" {
		add("-blockdev", "driver=file,filename="+optPath(m.Paths.Disk)+",node-name=file0")
		add("-blockdev", "driver=qcow2,file=file0,node-name="+diskNodeID)
		add("-device", "virtio-blk-pci,drive="+diskNodeID+",id=disk0")
	}
	// Extra disks follow the boot disk in the spec's order, so their PCI
	// slots are the same in every machine of a template whatever each
	// child gets behind them (disks.go). Read-only is a backend choice.
	for _, d := range s.Disks {
		f := m.Paths.Disks[d.ID]
		ro, format, proto := "", "qcow2", "file"
		if f.ReadOnly {
			ro = ",read-only=on"
		}
		if f.Format != "" {
			format = f.Format
		}
		if f.Block {
			// QEMU (since 6.0) refuses a block device under driver=file.
			proto = "host_device"
		}
		add("-blockdev", "driver="+proto+",filename="+optPath(f.File)+",node-name="+extraFileNode(d.ID)+ro)
		add("-blockdev", "driver="+format+",file="+extraFileNode(d.ID)+",node-name="+extraNode(d.ID)+ro)
		add("-device", "virtio-blk-pci,drive="+extraNode(d.ID)+",id="+extraDevice(d.ID))
	}
	nic := "virtio-net-pci,netdev=" + netdevID
	if nd := netdevArg(s); nd != "" {
		add("-netdev", nd)
	} else {
		nic = "virtio-net-pci" // network none: a NIC with no peer
	}
	add("-device", nic+",id="+nicID+",mac="+nicMAC(m)+",bus="+nicRootID)
	add("-device", "virtio-serial-pci,id=vser0")
	add("-chardev", "socket,id="+qgaID+",path="+optPath(m.Paths.QGA)+",server=on,wait=off")
	add("-device", "virtserialport,chardev="+qgaID+",name="+agentPort+",id=qgaport0")
	if sock := m.LedgerSocket(); sock != "" {
		// The family ledger's port (package ledger), declared as the
		// agent's is and after it, so its port number is the same in every
		// machine of a template. QEMU listens and never waits: the ledger
		// server connects, and may come and go. A machine without it (made
		// before vmfork had it) keeps none, nor do its children: a port the
		// device state does not list would not load.
		add("-chardev", "socket,id="+ledgerID+",path="+optPath(sock)+",server=on,wait=off")
		add("-device", "virtserialport,chardev="+ledgerID+",name="+ledgerPort+",id=ledgerport0")
	}
	// Every machine gets a fresh GUID unless told otherwise: the guest
	// reseeds its CRNG when it changes, which is what a fork child needs
	// (the GUID is not migrated). It is a backend, not a guest-visible
	// device property: GuestVisible drops it.
	guid := "auto"
	if m.VMGenID != "" {
		guid = m.VMGenID
	}
	add("-device", "vmgenid,id=vmgenid0,guid="+guid)
	// Extra devices come last, so they move none of vmfork's own; a child
	// gets only the devices still plugged in at the freeze, and their
	// backends (a RAM backend's block is in the device state).
	for _, o := range s.ActiveObjects() {
		add("-object", o)
	}
	for _, d := range s.Plugged() {
		add("-device", d.Arg)
	}
	if opt.Incoming {
		// After a load QEMU announces the NIC's configured MAC with RARP
		// frames, and has the guest announce its addresses (the
		// source's): on a shared bridge that would steal the source's
		// traffic. A child announces itself once its identity chain has
		// given it its own MAC and address. One round, not none: with
		// announce-rounds=0 QEMU 7.2's virtio-net frees its announce timer
		// in post_load and its reset then calls timer_del(NULL), so every
		// guest power-off or reboot of a loaded machine segfaulted QEMU
		// before it flushed its disks (docs/RELIABILITY.md). That one
		// round goes nowhere: Complete takes the backend's link down
		// before the load and the NIC's before the guest runs, and only
		// SetLink, once the identity chain has run, raises them again.
		add("-global", "migration.announce-rounds="+announceRounds)
		if opt.DevicesOnly {
			add(qemustate.DevicesOnlyArgs...)
			// A device state without RAM blocks leaves the firmware's
			// (pc.bios) empty: QEMU copies ROM files into guest memory
			// at reset but not when it waits for an incoming load, which
			// carries them otherwise. A guest that reboots would run
			// zeros at the reset vector and spin forever; this QEMU
			// exits instead (flushing its disks), and the machine is
			// stopped, to be started from its disk like any.
			add("-no-reboot")
		} else if opt.Paused {
			add("-S")
		}
		add("-incoming", "defer")
	}
	return a
}

// announceRounds is QEMU's migration.announce-rounds for a loaded machine
// (see Argv). Never "0": that crashes QEMU 7.2 at the guest's next
// virtio-net reset.
const announceRounds = "1"

func accelArg(accel string) string {
	if accel == AccelTCG {
		// QEMU 7.2 reserves a 1 GiB translation cache per process by default;
		// 128 MiB keeps a fork child's footprint small at no visible cost
		// for small guests.
		return "tcg,tb-size=128"
	}
	return accel
}

// ramObject is the guest RAM backend. share=on maps the machine's own file so
// a fork can freeze it; share=off maps a template privately, so the child's
// writes never reach the file (a template is never written after the freeze).
// No prealloc and no discard-data: both would touch or destroy a template.
func ramObject(m *vmfork.Machine) string {
	share := "off"
	if m.Paths.RAMShared {
		share = "on"
	}
	return fmt.Sprintf("memory-backend-file,id=%s,size=%dM,mem-path=%s,share=%s",
		ramID, m.Spec.MemoryMiB, optPath(m.Paths.RAM), share)
}

// nicMAC is the MAC QEMU's NIC is configured with: a fork child's own (the
// one its identity chain gives the guest) once it has one, else the
// record's. The guest's current MAC travels in the device state, so the
// configured one only shows after a reset: a child that reboots keeps its
// own MAC, and so its own lease on a shared network, instead of taking its
// source's. A warm-pool member starts before it knows its MAC and keeps the
// template's.
func nicMAC(m *vmfork.Machine) string {
	if m.GuestMAC != "" {
		return m.GuestMAC
	}
	return m.Spec.MAC
}

// netdevArg is the NIC's host backend, "" for none.
func netdevArg(s vmfork.Spec) string {
	switch s.Network.Effective().Kind {
	case vmfork.NetworkBridge:
		// The tap vmfork made and plugged into the bridge (network.go).
		return fmt.Sprintf("tap,id=%s,fd=%d", netdevID, tapFD)
	case vmfork.NetworkNone:
		return ""
	}
	var b strings.Builder
	b.WriteString("user,id=" + netdevID)
	for _, p := range s.Ports {
		// Forwards listen on loopback only: a fork child must not appear on
		// the host's network under the parent's identity.
		fmt.Fprintf(&b, ",hostfwd=tcp:127.0.0.1:%d-:%d", p.Host, p.Guest)
	}
	return b.String()
}

// optPath escapes a path for a QEMU option value, where a comma separates
// options and ",," stands for a literal comma.
func optPath(p string) string { return strings.ReplaceAll(p, ",", ",,") }

var macOption = regexp.MustCompile(`,mac=[0-9a-fA-F:]+`)

// GuestVisible returns the words of argv that the guest can see: machine,
// CPU, memory size, devices and direct-boot files. A template's children
// must match its source in all of them; backends (paths, ports, share=) may
// differ.
func GuestVisible(argv []string) []string {
	var out []string
	for i := 0; i+1 < len(argv); i++ {
		switch argv[i] {
		case "-device", "-machine", "-cpu", "-smp", "-m", "-kernel", "-initrd", "-append":
			w := argv[i+1]
			if strings.HasPrefix(w, "vmgenid,") {
				w = "vmgenid,id=vmgenid0"
			}
			// The configured MAC is not in the device state (nicMAC).
			w = macOption.ReplaceAllString(w, "")
			out = append(out, argv[i]+" "+w)
		}
	}
	return out
}
