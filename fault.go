package vmfork

// Fault points: named instants of the fork pipeline, of template save, of
// pool refill and of rm at which the crash tests (tests/crash_test.go,
// docs/RELIABILITY.md) kill vmfork, or a QEMU, and check the repair. Call
// sites read Fault(FaultForkReserved, pid). In the product (built without
// the failpoints tag, fault_off.go) Fault does nothing and reads nothing;
// a test build (go build -tags failpoints, make build: bin/vmfork-failpoints)
// acts on the points it is told of (fault_failpoints.go).

// Fault points, in the order a command reaches them.
const (
	// FaultForkReserved: a fork's journal entry and children's records
	// exist; the source is not paused yet.
	FaultForkReserved = "fork.reserved"
	// FaultFreezeLinked: the source is paused and its disks' images are
	// linked into the template as its frozen images; the switch to the
	// next tops, which QEMU has held open since before the pause, has not
	// happened (driver: qemudrv switchDisk).
	FaultFreezeLinked = "freeze.linked"
	// FaultFreezePaused: the source is paused, its disk switched and its
	// device state saved; its RAM is not frozen yet (driver).
	FaultFreezePaused = "freeze.paused"
	// FaultForkFrozen: the source runs again; no child has started.
	FaultForkFrozen = "fork.frozen"
	// FaultQEMUSpawned: a QEMU process exists whose PID no record holds
	// yet (driver; a boot, a fork child or a pool member).
	FaultQEMUSpawned = "qemu.spawned"
	// FaultForkRunning: a child's vCPUs run; its identity chain has not
	// started and its NIC link is down.
	FaultForkRunning = "fork.running"
	// FaultForkIdentity: a child's identity chain has run its first step
	// only.
	FaultForkIdentity = "fork.identity"
	// FaultSaveReserved: `template save` has recorded the kept template;
	// the source is not paused yet.
	FaultSaveReserved = "save.reserved"
	// FaultSaveFrozen: the kept template is frozen and the source runs;
	// its warm pool has not been started.
	FaultSaveFrozen = "save.frozen"
	// FaultPoolFilled: one warm-pool member has been started and recorded
	// while the pool is being filled; more are to come.
	FaultPoolFilled = "pool.filled"
	// FaultPoolTaken: a child has taken a pool member's process; the
	// device state is not loaded yet.
	FaultPoolTaken = "pool.taken"
	// FaultRmStopped: `rm` has killed the machine's QEMU; its record and
	// files are all still there.
	FaultRmStopped = "rm.stopped"
	// FaultRmRemoving: `rm` has taken the machine's record away; its files
	// are not deleted yet.
	FaultRmRemoving = "rm.removing"
)

// FaultPoints lists every point; the crash matrix has a case for each.
var FaultPoints = []string{
	FaultForkReserved, FaultFreezePaused, FaultForkFrozen, FaultQEMUSpawned,
	FaultForkRunning, FaultForkIdentity, FaultSaveReserved, FaultSaveFrozen,
	FaultPoolFilled, FaultPoolTaken, FaultRmStopped, FaultRmRemoving,
	FaultHibernateFrozen, FaultHibernateCommitted, FaultResumeRunning, // hibernate.go
	FaultFreezeLinked,                     // qemudrv; crash_xdisk_test.go
	FaultRewindRunning,                    // checkpoint.go
	FaultStartRunning,                     // start.go
	FaultDiskOnlyFrozen,                   // diskonly.go
	FaultDiskCommitted, FaultDiskRecorded, // blockdisk.go
}
