package vmfork

// File and directory names in the state and mem dirs. They are defined here
// only, so every path the store hands out can be checked against them.
const (
	dirMachines  = "machines"
	dirTemplates = "templates"
	dirJournal   = "journal"
	dirLocks     = "locks"
	dirPool      = "pool"
	// dirUsage keeps, per source, what its stopped children had made
	// private (admission.go): usage/SOURCE.json.
	dirUsage = "usage"
	// dirBroker is the secrets broker's: its control socket, lock, log,
	// registry (no values) and vmfork's CA (package broker).
	dirBroker = "broker"

	fileMachine  = "machine.json"
	fileManifest = "manifest.json"
	fileMember   = "member.json"
	fileDisk     = "disk.qcow2"
	fileQMP      = "qmp.sock"
	fileQGA      = "qga.sock"
	// fileLedger is the socket a machine's QEMU listens on for its family
	// ledger port (package ledger): the ledger server connects to it.
	fileLedger  = "ledger.sock"
	fileSerial  = "serial.log"
	fileQEMULog = "qemu.log"
	// FileDevState is a template's saved device state (a QEMU migration
	// stream without RAM).
	FileDevState = "devstate"
	ramSuffix    = ".ram"
)
