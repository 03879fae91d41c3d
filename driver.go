package vmfork

import (
	"context"

	"github.com/vmfork/vmfork/qmp"
)

// Driver runs machines on one kind of host. Keep it small: optional
// capabilities live in their own interfaces below (Forker, Pooler, ...),
// found by type assertion; a missing one makes the Manager return an error
// wrapping ErrUnsupported that names the driver. Every method says whether
// it is idempotent and what it leaves on error.
type Driver interface {
	// Name is the driver's name in records and messages, e.g. "qemu".
	Name() string

	// Start starts machine m from its record and returns once its guest
	// agent answers. It fills in m.PID, m.Accel and the Spec fields it
	// resolves. On error no process of m is left running and the error
	// carries the tail of QEMU's log. Not idempotent: m must not be running.
	Start(ctx context.Context, m *Machine) error

	// Stop shuts m down: politely first, then by force; with force it kills
	// at once. Idempotent: stopping a stopped machine returns nil.
	Stop(ctx context.Context, m *Machine, force bool) error

	// Status reports m's actual state; the record may be stale because a
	// QEMU process can exit on its own. It does not change the record.
	Status(ctx context.Context, m *Machine) (State, error)

	// Agent connects to m's guest agent and returns once the agent has
	// answered (the embedded driver's sync, libvirt's ping): the identity
	// chain's agent step counts on that. The caller closes it.
	Agent(ctx context.Context, m *Machine) (*qmp.Agent, error)
}

// The optional capabilities. A driver asserts each one it offers
// (var _ vmfork.Forker = (*Driver)(nil)).

// FreezeOptions say what a Forker's Freeze does beyond taking the fork
// point.
type FreezeOptions struct {
	// DetachDevices unplugs the source's extra devices for the freeze when
	// they forbid it, and plugs them back into the source after (fork
	// --detach-devices); the template's spec has them detached, so
	// children are made without them.
	DetachDevices bool
	// LeavePaused leaves the source paused once the template is whole,
	// instead of resuming it (sharedmem.Recipe.LeavePaused). Hibernate
	// asks for it: the machine's QEMU ends next, and a guest that ran on
	// after the instant could show clients work (a reply, a TCP ack) that
	// the resumed machine never did.
	LeavePaused bool
	// Delta allows the template's RAM to be a delta on the file the source
	// maps (delta.go), where it would otherwise be copied. Only for a fork
	// whose children the driver starts itself.
	Delta bool
	// Children is how many children the fork starts from the template:
	// a burst gets a full file they all share rather than a delta each of
	// them would hold alone (sharedmem.PlanRequest.Children).
	Children int
}

// Forker is the optional driver capability to fork machines.
type Forker interface {
	// Freeze takes a fork point of running machine src into template t:
	// pause, switch src's disk to a new overlay on t.Paths.Disk (the old top
	// moves there), save device state to t.Paths.DevState, freeze RAM into
	// t.Paths.RAM, resume. It fills t.Manifest. Not idempotent: t MUST be a
	// fresh template. On error src MUST run again, unless the error wraps
	// ErrStillPaused (the journal's repair then resumes it through Resume),
	// and t.Paths.RAM MUST NOT exist; the caller removes t's other files.
	// src's record is saved by the caller also on error: once the disk
	// switch is done src runs on its new overlay whatever failed after.
	// opts say what the freeze does beyond that.
	Freeze(ctx context.Context, src *Machine, t *Template, opts FreezeOptions) (FreezeResult, error)

	// StartChild starts child from template t (device state and RAM) and
	// returns once it runs, its NIC link down. Not idempotent. On error no
	// process of child MUST be left.
	StartChild(ctx context.Context, child *Machine, t *Template) error

	// Resume resumes m if it is paused; used to repair a source left paused
	// by an interrupted fork. Idempotent: a running or stopped m MUST get
	// nil and be left as it is.
	Resume(ctx context.Context, m *Machine) error
}

// DiskForker is the optional driver capability behind fork --disk-only
// (diskonly.go): it switches the disks of a running machine without
// pausing its vCPUs. The caller has frozen the guest's filesystems (or
// accepted a crash-consistent copy) for the moment of the switch.
type DiskForker interface {
	// SwitchDisks makes every disk of running src that t freezes (the boot
	// disk and t.Disks' frozen ones) t's, read-only from now on, and puts
	// src on new overlays on them, all in one QMP transaction: all switch,
	// or none does. It neither stops nor resumes src, and saves no device
	// state or RAM. Not idempotent: t MUST be a fresh template. src's
	// record is saved by the caller also on error.
	SwitchDisks(ctx context.Context, src *Machine, t *Template) error
}

// Pooler is the optional driver capability behind warm pools: StartChild
// split in two, Prestart ahead of any fork and Complete in it.
type Pooler interface {
	// Prestart starts m's process from template t up to where it waits
	// for the device state. Not idempotent. On error no process of m MUST
	// be left, and m.PID is 0.
	Prestart(ctx context.Context, m *Machine, t *Template) error
	// Complete loads t's device state into prestarted m, keeps its NIC
	// link down and lets it run. Not idempotent: a member is completed
	// once. On error m's process MUST be killed.
	Complete(ctx context.Context, m *Machine, t *Template) error
}

// InPlaceStarter is the optional driver capability to start a new process
// for a machine that keeps its name and files (rewind, resume), where
// StartChild starts a machine new to the driver. The embedded driver can:
// a machine is its directory and its process. So can the libvirt driver:
// its domains are transient, so once the old QEMU has ended the name is
// free for a new child domain.
type InPlaceStarter interface {
	// StartInPlace starts machine m's new process from template t, as
	// StartChild does (m's old process is gone; its record names its
	// files, a new disk overlay on t's frozen disk among them), and
	// returns once it runs, its NIC link down. Not idempotent. On error no
	// process of m MUST be left.
	StartInPlace(ctx context.Context, m *Machine, t *Template) error
}

// LinkSetter is the optional driver capability to switch a machine's NIC
// link, which keeps a fork child off the network until it has its identity.
// A live fork needs it and is refused before the pause without it.
type LinkSetter interface {
	// SetLink sets running m's NIC link up or down. Idempotent. On error
	// the link is as it was or unknown; the caller counts the child as
	// failed.
	SetLink(ctx context.Context, m *Machine, up bool) error
}

// NetworkChecker is an optional driver capability: it checks that what
// machine m's NIC is plugged into on the host is there (a bridge, a libvirt
// network that is active) and that the driver supports it. Fork calls it
// before the source is paused and Boot before anything starts, so that a
// missing network fails with nothing changed.
type NetworkChecker interface {
	// CheckNetwork changes nothing (so it is idempotent); its error MUST
	// wrap ErrInvalid.
	CheckNetwork(ctx context.Context, m *Machine) error
}

// Adopter is the optional driver capability to fork a machine vmfork did
// not make (a foreign libvirt domain). An adopted machine stays its owner's.
// vmfork forks it like one of its own, but never writes or removes its
// files, never stops it unless told to (vmfork stop), and vmfork rm only
// forgets it. Its first fork with a disk freezes the machine's own image in
// place for the children and moves the machine onto a new overlay in its
// directory in the state dir: from then on it depends on that file, and
// vmfork cannot forget it until its owner has merged the overlay back
// (Disown says how).
type Adopter interface {
	// Adopt inspects the running machine called name and returns a record
	// for it with Adopted set, or an error naming what makes it unforkable.
	// paths are the files the store gives it. It changes nothing.
	Adopt(ctx context.Context, name string, paths Paths) (*Machine, error)

	// Disown returns nil when adopted machine m no longer uses any file in
	// the state dir (or is gone), so that vmfork can forget it and remove
	// its files; else an error naming the file that is still used and how
	// to stop using it. It changes nothing.
	Disown(ctx context.Context, m *Machine) error
}

// HostChecker is the optional driver capability to say, without starting
// anything, what manifest a child of t would have on this host (compat.go).
type HostChecker interface {
	// HostManifest returns the manifest of a child of t started here now:
	// this host's QEMU version, and t's machine type, CPU model and device
	// list as this host's QEMU and this driver would give them. A machine
	// type or CPU model this QEMU lacks comes back empty. It changes
	// nothing.
	HostManifest(ctx context.Context, t *Template) (Manifest, error)
}

// LayerDropper is the optional driver capability to take a layer out of a
// running machine's disk chain, so that a template no child needs any more
// can be removed although the source's disk was built on it (gc.go).
type LayerDropper interface {
	// DropLayer makes running m stop reading layer: its data, and that of
	// every layer above it, is copied into m's top image. Idempotent: nil
	// when layer is not below m's top (any more). The layers themselves
	// are never written. On error m keeps running on a chain that may still
	// read layer, so the caller keeps the template.
	DropLayer(ctx context.Context, m *Machine, layer string) error
}

// ActiveLayerReporter is the optional driver capability to ask a running
// machine's QEMU which image each of its disks writes (the active layer).
// The crash repair of a freeze (journal.go:repairSourceDisk) asks it: a
// driver that opens a disk's next top before the pause (qemudrv) makes
// QEMU hold that image before the switch, so a held image is not proof
// that the disk was switched to it. A driver without it (libvirtdrv:
// libvirt opens the new top only inside its snapshot call, in the pause)
// is asked through the image locks instead.
type ActiveLayerReporter interface {
	// ActiveLayers returns the file each disk of running m writes, as
	// its QEMU names it (hard links: compare with overlay.SameFile).
	ActiveLayers(ctx context.Context, m *Machine) (ActiveLayers, error)
}

// ActiveLayers is what ActiveLayerReporter returns: the active layer of
// the boot disk and of each extra disk by DiskSpec.ID; "" or absent where
// QEMU has no such disk.
type ActiveLayers struct {
	Disk  string
	Disks map[string]string
}
