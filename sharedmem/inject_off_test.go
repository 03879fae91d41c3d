//go:build !failpoints && linux && amd64

package sharedmem

import "testing"

// noInjection: the product build injects nothing.
func noInjection(*testing.T) {}

// TestInjectOff: the product build ignores VMFORK_TEST_FREEZE_FAIL.
func TestInjectOff(t *testing.T) {
	for _, p := range []string{InjectAfterStop, InjectBeforeRAM, InjectAfterRAM} {
		t.Setenv("VMFORK_TEST_FREEZE_FAIL", p)
		if err := Inject(p); err != nil {
			t.Errorf("Inject(%q) with VMFORK_TEST_FREEZE_FAIL=%s = %v, want nil without the failpoints tag", p, p, err)
		}
	}
}
