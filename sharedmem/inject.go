package sharedmem

import (
	"errors"
	"fmt"
	"os"
)

// InjectEnv names the variable through which an integration test makes a
// freeze fail at one of the points below. Tests run the real binary, so the
// environment is how they reach inside a freeze; nothing else reads it.
const InjectEnv = "VMFORK_TEST_FREEZE_FAIL"

// Fault-injection points of a freeze, the same in both drivers.
const (
	InjectAfterStop = "after-stop"
	InjectBeforeRAM = "before-ram"
	InjectAfterRAM  = "after-ram" // the source is remapped, not resumed
)

// ErrInjected is the failure a test asked for.
var ErrInjected = errors.New("injected failure")

// Inject fails at point when the test environment asks for it.
func Inject(point string) error {
	if os.Getenv(InjectEnv) == point {
		return fmt.Errorf("%s: %w", point, ErrInjected)
	}
	return nil
}
