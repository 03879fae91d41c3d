package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

// exitCode maps each error scripts branch on to its documented code
// (exitCodesHelp), through any wrapping, and everything else to 1.
func TestExitCode(t *testing.T) {
	// exitCode also prints each error on stderr, as main's last word.
	wrap := func(err error) error { return fmt.Errorf("fork %q: %w", "web", err) }
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"success", nil, 0},
		{"plain failure", errors.New("boom"), exitFailure},
		{"unsupported is a failure", wrap(vmfork.ErrUnsupported), exitFailure},
		{"still paused is a failure", wrap(vmfork.ErrStillPaused), exitFailure},
		{"usage error", usageError{errors.New("--count 0: want at least 1")}, exitUsage},
		{"wrapped usage error", wrap(usageError{errors.New("bad flag")}), exitUsage},
		{"invalid", wrap(vmfork.ErrInvalid), exitUsage},
		{"exists", wrap(vmfork.ErrExists), exitUsage},
		{"help topic", cli.Exit("No help topic for 'nosuch'", 3), exitUsage},
		{"other cli exit", cli.Exit("something else", 3), exitFailure},
		{"partial", wrap(vmfork.ErrPartial), exitPartial},
		{"not found", wrap(vmfork.ErrNotFound), exitNotFound},
		{"joined not found", errors.Join(errors.New("first"), wrap(vmfork.ErrNotFound)), exitNotFound},
		{"no room", wrap(vmfork.ErrNoRoom), exitNoRoom},
		{"partial wins over no room", wrap(fmt.Errorf("%w: %w", vmfork.ErrNoRoom, vmfork.ErrPartial)), exitPartial},
		{"exec passes the guest's code", exitError{code: 42}, 42},
		{"exec's code wrapped", wrap(exitError{code: 7}), 7},
		{"partial wins over not found", wrap(fmt.Errorf("%w: %w", vmfork.ErrPartial, vmfork.ErrNotFound)), exitPartial},
		{"invalid wins over partial", wrap(fmt.Errorf("%w: %w", vmfork.ErrInvalid, vmfork.ErrPartial)), exitUsage},
	} {
		if got := exitCode(c.err); got != c.want {
			t.Errorf("%s: exitCode(%v) = %d, want %d", c.name, c.err, got, c.want)
		}
	}
}
