//go:build failpoints

package sharedmem

import (
	"errors"
	"fmt"
	"os"
)

// InjectEnv names the variable through which an integration test makes a
// freeze fail at one of the Inject points. Tests run the real binary, so the
// environment is how they reach inside a freeze; only test builds (-tags
// failpoints) read it.
const InjectEnv = "VMFORK_TEST_FREEZE_FAIL"

// ErrInjected is the failure a test asked for.
var ErrInjected = errors.New("injected failure")

// Inject fails at point when the test environment asks for it.
func Inject(point string) error {
	if os.Getenv(InjectEnv) == point {
		return fmt.Errorf("%s: %w", point, ErrInjected)
	}
	return nil
}
