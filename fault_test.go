package vmfork

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// faultHelper runs TestFaultHelper in a child process with fault set as
// VMFORK_FAULT, and reports whether SIGKILL ended it.
func faultHelper(t *testing.T, fault string) (killed bool, err error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestFaultHelper$")
	cmd.Env = append(os.Environ(), "VMFORK_FAULT_HELPER=1", "VMFORK_FAULT="+fault)
	err = cmd.Run()
	var ee *exec.ExitError
	killed = errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
	return killed, err
}

// TestFaultHelper reaches FaultRmStopped, in faultHelper's child process.
func TestFaultHelper(t *testing.T) {
	if os.Getenv("VMFORK_FAULT_HELPER") == "" {
		t.Skip("run by faultHelper")
	}
	Fault(FaultRmStopped, 0)
}
