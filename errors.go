package vmfork

import "errors"

// Sentinel errors. Test them with errors.Is; the CLI maps them to exit codes.
var (
	// ErrNotFound means a named machine or template does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists means a name is already taken.
	ErrExists = errors.New("already exists")
	// ErrInvalid means the request itself is wrong (bad name, missing file,
	// bad size); nothing was changed.
	ErrInvalid = errors.New("invalid argument")
	// ErrNotRunning means the operation needs a running machine.
	ErrNotRunning = errors.New("not running")
	// ErrUnsupported means the driver lacks an optional capability.
	ErrUnsupported = errors.New("not supported")
	// ErrPartial means an operation on several machines succeeded for some of
	// them only; the result lists which.
	ErrPartial = errors.New("partial success")
)

// invalidError marks an error as bad input while keeping the original error
// (fs.ErrNotExist and so on) for errors.Is, and its one-line message.
type invalidError struct{ err error }

func (e invalidError) Error() string   { return e.err.Error() }
func (e invalidError) Unwrap() []error { return []error{e.err, ErrInvalid} }

// asInvalid marks err as bad input.
func asInvalid(err error) error { return invalidError{err} }

// ErrStillPaused means an error left a machine paused: resuming it failed
// too. The journal keeps the evidence; the next vmfork command retries.
var ErrStillPaused = errors.New("machine is still paused")
