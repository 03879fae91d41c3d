//go:build failpoints && linux && amd64

package sharedmem

import "testing"

// TestRecipeRollsBackInjected is TestRecipeRollsBack for the failures
// between the recipe's steps, which only a test build can inject.
func TestRecipeRollsBackInjected(t *testing.T) {
	for _, c := range []struct {
		point string
		rollbackCase
	}{
		{InjectAfterStop, rollbackCase{name: "after stop", want: ErrInjected}},
		{InjectBeforeRAM, rollbackCase{name: "before RAM", want: ErrInjected, wantUndo: true}},
		{InjectAfterRAM, rollbackCase{name: "after RAM, injected", want: ErrInjected, wantUndo: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(InjectEnv, c.point)
			testRollback(t, c.rollbackCase)
		})
	}
}

// noInjection clears a failure the environment would inject.
func noInjection(t *testing.T) {
	t.Helper()
	t.Setenv(InjectEnv, "")
}
