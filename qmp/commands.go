package qmp

import (
	"context"
	"fmt"
	"os"
)

// QMP command names used by vmfork (QEMU 7.2, qapi/*.json). go-qemu's generated qmp/raw follows
// the QEMU 2.11 schema, so the typed helpers below are written by hand. The migration commands
// are in package qemustate, with the sequences that send them.
const (
	CmdQMPCapabilities     = "qmp_capabilities"
	CmdStop                = "stop"
	CmdCont                = "cont"
	CmdQueryStatus         = "query-status"
	CmdGetFD               = "getfd"
	CmdCloseFD             = "closefd"
	CmdSetLink             = "set_link"
	CmdSystemPowerdown     = "system_powerdown"
	CmdQuit                = "quit"
	CmdQueryVMGenerationID = "query-vm-generation-id"
)

// Run states reported by query-status (qapi/run-state.json, RunState) that vmfork acts on.
const (
	StatusRunning     = "running"
	StatusPaused      = "paused"
	StatusInMigrate   = "inmigrate"   // started with -incoming, waiting for migrate-incoming
	StatusPostMigrate = "postmigrate" // after an outgoing migration; cont resumes it
	StatusShutdown    = "shutdown"
)

// Status is the reply of query-status.
type Status struct {
	Status  string `json:"status"` // one of the Status constants, or another RunState
	Running bool   `json:"running"`
}

// Stop pauses the guest's vCPUs. It drains in-flight I/O first, so RAM, device state and disks
// are one point in time afterwards.
func (m *Monitor) Stop(ctx context.Context) error {
	return m.Execute(ctx, CmdStop, nil, nil)
}

// Cont resumes the guest. On a migration destination it must come only after query-migrate
// reports "completed": QEMU 7.2 activates the images before it checks the state, and an early
// cont fails with a write-lock error and can kill the incoming QEMU.
func (m *Monitor) Cont(ctx context.Context) error {
	return m.Execute(ctx, CmdCont, nil, nil)
}

// QueryStatus reports the VM's run state.
func (m *Monitor) QueryStatus(ctx context.Context) (Status, error) {
	var st Status
	err := m.Execute(ctx, CmdQueryStatus, nil, &st)
	return st, err
}

// GetFD passes f to QEMU under name, for use as "fd:name" in a migration URI. QEMU keeps its own
// duplicate, so the caller may close f afterwards; CloseFD releases QEMU's copy.
func GetFD(ctx context.Context, ex Executor, name string, f *os.File) error {
	return ex.ExecuteWithFile(ctx, CmdGetFD, map[string]string{"fdname": name}, f, nil)
}

// CloseFD closes the descriptor QEMU holds under name.
func CloseFD(ctx context.Context, ex Executor, name string) error {
	return ex.Execute(ctx, CmdCloseFD, map[string]string{"fdname": name}, nil)
}

// SetLink sets the link state of the NIC or netdev called name, so a child's guest sees a carrier
// change and renews its address.
func (m *Monitor) SetLink(ctx context.Context, name string, up bool) error {
	args := struct {
		Name string `json:"name"`
		Up   bool   `json:"up"`
	}{name, up}
	return m.Execute(ctx, CmdSetLink, args, nil)
}

// QueryVMGenerationID returns the vmgenid device's GUID. Each child gets its own from guid=auto
// on its command line: the GUID is not migrated.
func QueryVMGenerationID(ctx context.Context, ex Executor) (string, error) {
	var r struct {
		GUID string `json:"guid"`
	}
	if err := ex.Execute(ctx, CmdQueryVMGenerationID, nil, &r); err != nil {
		return "", err
	}
	if r.GUID == "" {
		return "", fmt.Errorf("qmp: %s: empty guid", CmdQueryVMGenerationID)
	}
	return r.GUID, nil
}
