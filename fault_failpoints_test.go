//go:build failpoints

package vmfork

import "testing"

func TestParseFault(t *testing.T) {
	for _, c := range []struct{ in, point, action string }{
		{"", "", ""},
		{"fork.running", "fork.running", "self"},
		{"pool.taken:qemu", "pool.taken", "qemu"},
	} {
		got := parseFault(c.in)
		if got.point != c.point || got.action != c.action {
			t.Errorf("parseFault(%q) = %q, %q; want %q, %q", c.in, got.point, got.action, c.point, c.action)
		}
	}
}

// VMFORK_FAULT kills the process that reaches the named point, and only
// that point: checked in a child process running TestFaultHelper.
func TestFaultKillsItself(t *testing.T) {
	for _, c := range []struct {
		fault  string
		killed bool
	}{{FaultRmStopped, true}, {FaultForkFrozen, false}, {"", false}} {
		killed, err := faultHelper(t, c.fault)
		if killed != c.killed || (!killed && err != nil) {
			t.Errorf("%s=%q at %s: err %v, killed %v; want killed %v", FaultEnv, c.fault, FaultRmStopped, err, killed, c.killed)
		}
	}
}
