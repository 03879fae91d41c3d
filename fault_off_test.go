//go:build !failpoints

package vmfork

import "testing"

// TestFaultOff: the product ignores VMFORK_FAULT; a point it names is
// reached and the process carries on.
func TestFaultOff(t *testing.T) {
	if killed, err := faultHelper(t, FaultRmStopped); killed || err != nil {
		t.Errorf("VMFORK_FAULT=%s at %s without the failpoints tag: err %v, killed %v; want it ignored", FaultRmStopped, FaultRmStopped, err, killed)
	}
}
