package ledger

import _ "embed"

// Helper is the guest helper, vmfork-ledger: a POSIX shell script (busybox
// sh, dash, bash) that speaks the protocol over the guest's port. Install
// it in a guest as an executable file, e.g. /usr/local/bin/vmfork-ledger.
// Its usage and exit codes are in its header and in docs/LEDGER.md.
//
//go:embed vmfork-ledger
var Helper []byte

// HelperName is the helper's file name.
const HelperName = "vmfork-ledger"

// PortName is the virtio-serial port's name: the guest finds it at
// /dev/virtio-ports/org.vmfork.ledger.0.
const PortName = "org.vmfork.ledger.0"
