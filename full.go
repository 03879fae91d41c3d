package vmfork

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// nearlyFull is the free space under which the state dir or the mem dir
// counts as full: less than a device-state file and a few overlays need.
const nearlyFull = 8 << 20

// explainFull adds to a failed step's error which of vmfork's directories
// is full, so that the one-line error says what to free. The file systems
// are looked at, not the error: QEMU reports a full disk as text in its
// migration error, with no errno. ramBytes is what the step may have needed
// in the mem dir (a freeze copies up to the source's RAM there).
func (s *Store) explainFull(err error, ramBytes int64) error {
	var done *fullError
	// Admission's refusal says what is short itself (admission.go).
	if err == nil || errors.As(err, &done) || errors.Is(err, ErrNoRoom) {
		return err
	}
	enospc := errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
	var full []string
	for _, d := range []struct {
		what, path string
		need       int64
	}{{"state dir", s.StateDir, 0}, {"mem dir", s.MemDir, ramBytes}} {
		var st unix.Statfs_t
		if unix.Statfs(d.path, &st) != nil {
			continue
		}
		free, size := int64(st.Bavail)*st.Bsize, int64(st.Blocks)*st.Bsize
		if free < nearlyFull || (enospc && free < d.need) {
			full = append(full, fmt.Sprintf("%s %s is full: %s free of %s", d.what, d.path, freeMiB(free), freeMiB(size)))
		}
	}
	if len(full) == 0 {
		return err
	}
	return &fullError{err: err, full: strings.Join(full, "; ")}
}

// fullError is an error explained by explainFull, which explains it once.
type fullError struct {
	err  error
	full string // which directories are full
}

func (e *fullError) Error() string { return e.err.Error() + " (" + e.full + ")" }
func (e *fullError) Unwrap() error { return e.err }

func freeMiB(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
