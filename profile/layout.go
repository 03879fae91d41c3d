package profile

// The guest-visible layout both drivers must render the same way: QEMU's
// migration stream names RAM blocks and devices, and the guest's own
// software looks for the agent's port by name, so a machine started by one
// driver and its child started by the other (a template exported from a
// libvirt host and forked by the embedded driver) only fit when these agree.
const (
	// RAMBlock is the id of the guest's main RAM block (QEMU's
	// memory-backend id for pc/q35; libvirt 9.0 also names the RAM file
	// after it: <memory_backing_dir>/<id>-<name[:20]>/pc.ram).
	RAMBlock = "pc.ram"
	// AgentChannel is the virtio-serial port name qemu-ga in the guest
	// opens.
	AgentChannel = "org.qemu.guest_agent.0"
	// LedgerChannel is the family ledger's virtio-serial port name
	// (package ledger's PortName): /dev/virtio-ports/org.vmfork.ledger.0 in
	// the guest. Both drivers put it on the agent's virtio-serial bus,
	// after the agent's port, so that its port number (part of the device
	// state) is the same in parent and child.
	LedgerChannel = "org.vmfork.ledger.0"
)
