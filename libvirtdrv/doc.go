// Package libvirtdrv is vmfork's driver for libvirt hosts (libvirt 9.0,
// QEMU 7.2): machines, fork parents and fork children are ordinary libvirt
// domains, listed by `virsh list`, reachable with `virsh console`, removable
// with `virsh destroy`. It follows the recipe in
// shared/reference/libvirt-children.md.
//
// # The model
//
// vmfork's record (machine.json in the state dir) is a machine's definition;
// its domain is what runs. Every domain vmfork creates is transient
// (virDomainCreateXML): it exists while QEMU runs, and libvirt forgets it
// when it stops, so no stale definition outlives a `vmfork rm`. A machine
// whose domain is gone, stopped by vmfork or destroyed with virsh, is
// stopped; its disk and record stay until `vmfork rm`. A domain carries
// vmfork's element in <metadata> (namespace MetadataNS: machine name,
// machine directory, parent, template): vmfork acts only on domains whose
// mark matches the record, never on a foreign domain of the same name. An
// adopted domain (below) carries no mark; its record names it by uuid.
//
// A booted machine (BootXML) has the embedded driver's device model: q35
// pinned to its versioned type, qemu64, guest RAM in a file mapped shared
// (<memoryBacking><source type='file'/><access mode='shared'/>), no balloon,
// a vmgenid, the guest-agent channel, a user-mode NIC and a pty serial
// console logged to the machine's serial.log. QEMU runs as the user running
// vmfork (a static DAC <seclabel> with relabel='no'), as with the embedded
// driver: vmfork's state and mem dirs are private to that user, and libvirt
// changes no file's owner. libvirt owns QMP and the guest-agent socket;
// vmfork reaches them through virDomainQemuMonitorCommand (passthrough,
// which taints the domain as custom-monitor and changes nothing else) and
// virDomainQemuAgentCommand. Port forwards are added over QMP (hostfwd_add):
// libvirt's own <portForward> needs the passt backend.
//
// # A fork
//
// Freeze checks the source's live XML (Check) and prepares, while the
// source runs, everything but the pause: the next overlay, the device-state
// file, and the RAM plan both drivers share (sharedmem.Plan). It then pauses
// the source with libvirt's suspend, moves its disk onto the new overlay with
// a disk-only external snapshot, saves the device state through passthrough
// with a passed fd ("fd:" URI; libvirt's seccomp sandbox kills QEMU on
// "exec:"), gives the template its RAM and resumes. The RAM step copies
// nothing on a first fork: the file libvirt made for the source
// (<memory_backing_dir>/<id>-<name[:20]>/pc.ram, on /dev/shm after setup)
// gets a second name, the template's, in vmfork's mem dir, and QEMU is
// remapped privately onto it in place (ptrace-injected mmap and dup3, which
// root may do to libvirt's QEMU: it runs as vmfork's user, or as
// libvirt-qemu for an adopted domain, and its seccomp filter allows both
// calls). The domain stays the same one: name, uuid, id and QEMU process.
// Later forks copy only the pages written since; a `vmfork fork` of a domain
// whose frozen file a template still needs makes a delta template on it
// instead of copying it, and children of a delta get its pages written into
// their QEMU before the device state loads (delta.go). libvirt removes its own
// name for the file when the domain stops; the template keeps its own. With
// memory_backing_dir on another file system than the mem dir no template can
// be the source's file, and the freeze copies it in the pause, saying so.
// The source's migratable XML is kept in the template (FileSourceXML).
//
// A child (ChildXML) is that XML with only its backends changed, started
// paused with -incoming defer through <qemu:commandline>. libvirt names the
// RAM file QEMU opens, <memory_backing_dir>/<id>-<name[:20]>/pc.ram, only
// once the domain has an id. A child maps that file shared, fresh and empty
// (QEMU makes it): StartChild remaps it privately onto the template before
// anything is loaded, so its RAM block is share=on and a fork of the child
// copies only its private pages, never its whole RAM. Its metadata names the
// template as mapped-ram; no start hook links anything there. Where the
// remap is not built (not x86-64) a child maps its RAM private and the start
// hook (Hook, installed by Setup as a drop-in in /etc/libvirt/hooks/qemu.d/),
// which runs after libvirt made that directory and before it executes QEMU,
// links the template file there. StartChild then checks that QEMU really
// maps the template, loads the device state with x-ignore-shared, sets the
// NIC link down until the identity chain has run, and resumes. When the child
// stops, libvirt deletes its RAM directory; the template survives.
//
// # Several disks, and disk-only forks
//
// A machine vmfork boots with extra disks (vmfork.DiskSpec) has them after
// the boot disk in the spec's order, vdb, vdc, ..., each with its id as its
// <serial> (extraBootDisks); an adopted domain's extra disks are its
// writable file disks, their ids their targets. Freeze switches every cow
// or shared disk in the one snapshot that switches the boot disk
// (prepareExtraDisks, snapshotExtras) and names the others (fresh, keep,
// read-only) with snapshot='no', so they stay as they are. A child's XML
// points each writable disk at the image its policy gave it, found by the
// id in the disk's serial or, for an adopted domain, by its target
// (childDisks, diskID); a disk shared at boot is read-only in the source's
// XML already and stays the same image.
//
// fork --disk-only (SwitchDisks) makes the same snapshot with the domain
// running: libvirt 9.0 stops the vCPUs for an external snapshot only when
// it includes memory (qemuSnapshotCreateActiveExternal). The Manager
// freezes the guest's filesystems around it through the agent passthrough;
// libvirt's QUIESCE flag would freeze and thaw inside the one call, out of
// reach of vmfork's bound, journal and repair. The children boot from their
// records (BootXML), so a disk-only fork of an adopted domain is refused.
//
// # Existing domains: adoption
//
// `vmfork -c qemu:///system fork web1` forks a domain vmfork did not make,
// such as one an ops team defined with virsh; its children are vmfork's
// domains like any others. Adopt reads the domain's live XML and changes
// nothing. It takes a running domain that passes Check (which also asks for
// the <genid/> and the guest-agent channel a child's identity comes from,
// and for writable disks that are files) and whose guest agent is
// connected, and records it with Machine.Adopted: the domain's uuid and its
// own disk images (the first writable one the boot disk, each other an
// extra disk named by its target, forking cow).
//
// The first fork freezes the domain's own image in place. It becomes the
// children's frozen base: a hard link in the template's directory, or,
// where none can be made or would work (another file system; a backing file
// named relative to the image's directory), the image where it is
// (Template.ForeignDisk). The domain moves onto a new overlay in the state
// dir, <state-dir>/machines/<name>/disk.1.qcow2, whose base is the image
// where it is. The move is libvirt's disk-only external snapshot, so libvirt
// points the domain's live and persistent definitions at the overlay: from
// then on the domain runs on it, across restarts too. vmfork never writes,
// moves or removes the image. When the last child goes the template goes
// (the link, never the image), and nothing of the image is copied: it stays
// the base of the domain's chain. Later forks freeze vmfork's own overlays,
// as for any machine.
//
// libvirt runs such a domain's QEMU as its own user (libvirt-qemu), which
// cannot enter vmfork's 0700 directories. The freeze gives the directories
// on the way to the domain's overlay and its children's (the state dir,
// machines/, templates/ and theirs) search permission for others, never
// read permission; a directory above the state dir that QEMU cannot search
// is an error that names it.
//
// `vmfork rm` of an adopted domain forgets it: its record and files go, and
// the domain runs on, untouched. Not while it still uses a file in the state
// dir: rm then fails, names the overlay and the command that gives the
// domain back its own image, `virsh blockcommit NAME vda --base IMAGE
// --active --pivot`. That command writes the image, so vmfork leaves it to
// the owner, to run once the children, which read the image, are gone.
// --force does not change this. `vmfork stop` stops an adopted domain like
// any machine, and a stopped one is not forked (start it first: a stopped
// source's children boot from its record, which does not hold the domain's
// definition). A fork taints the domain in libvirt's eyes (custom monitor
// commands, as for every domain vmfork forks); nothing else changes.
//
// # An ordinary user's daemon: qemu:///session
//
// With qemu:///session the domains are the user's own session daemon's,
// QEMU runs as the user, and everything above works the same but for what
// session.go lists: no DAC <seclabel> (the session daemon has none), its own
// pid files and logs, libvirt networks and a contract's nwfilter refused
// (the system daemon's), and a setup that only points the user's
// memory_backing_dir at a tmpfs.
//
// # What the host needs
//
// `vmfork libvirt setup` installs the hook and, when libvirt's
// memory_backing_dir is on disk, points it at /dev/shm (libvirt then uses
// /dev/shm/libvirt/qemu), restarting libvirtd once. The template RAM file
// must be readable and writable by QEMU's user (QEMU 7.2 opens a mem-path
// O_RDWR even to map it privately), so Freeze gives it to the source's DAC
// user with mode 0600. A fork child can be forked in turn like any source.
package libvirtdrv
