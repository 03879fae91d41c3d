package sharedmem

// The pause window of a freeze: what a driver's Freeze does the same way,
// whatever reaches its QEMU (a QMP socket of its own, or libvirt): the window
// in which the source is paused, with the undo stack that guarantees a failed
// freeze never leaves the source paused, and the template's RAM file. It
// knows neither machines nor templates, so a driver hands it functions, paths
// and its own "still paused" sentinel.

import (
	"context"
	"fmt"
	"time"
)

// RollbackTimeout bounds undoing a failed freeze, which runs even after the caller's ctx ended.
const RollbackTimeout = 10 * time.Second

// PauseSource is how a driver pauses and resumes the source of a freeze.
type PauseSource struct {
	Pause, Resume func(context.Context) error
	// StillPaused is wrapped by every error after which the source may still be paused (the
	// driver's sentinel: this package imports nothing above it).
	StillPaused error
}

// PauseWindow is the time a source is paused, from Pause to Resume. Its undo stack holds one step per
// change made in it, run in reverse by Rollback when the freeze fails; the first step resumes the
// source.
type PauseWindow struct {
	src   PauseSource
	start time.Time
	undo  []func(context.Context) error
}

// Pause pauses src and opens its PauseWindow. The caller defers Rollback at once.
func Pause(ctx context.Context, src PauseSource) (*PauseWindow, error) {
	start := time.Now()
	if err := src.Pause(ctx); err != nil {
		return nil, fmt.Errorf("pause: %w", err)
	}
	return &PauseWindow{src: src, start: start, undo: []func(context.Context) error{src.Resume}}, nil
}

// OnFailure pushes a step that reverses a change just made in the window.
func (w *PauseWindow) OnFailure(undo func(context.Context) error) {
	w.undo = append(w.undo, undo)
}

// Keep drops the undo steps pushed so far, for changes that stand from now on whatever happens;
// a failure still resumes the source.
func (w *PauseWindow) Keep() {
	w.undo = w.undo[:1]
}

// Resume resumes the source, closes the window and returns how long the source was paused. When
// resuming fails the window stays open, so Rollback tries once more, and its error wraps
// StillPaused only if that fails too (the source then is still paused).
func (w *PauseWindow) Resume(ctx context.Context) (time.Duration, error) {
	if err := w.src.Resume(ctx); err != nil {
		return 0, fmt.Errorf("resume: %w", err)
	}
	w.undo = nil
	return time.Since(w.start), nil
}

// Leave closes the window with the source still paused, for a freeze whose
// caller ends the source next (hibernate), and returns how long it has been
// paused. The caller owns resuming it on any later failure.
func (w *PauseWindow) Leave() time.Duration {
	w.undo = nil
	return time.Since(w.start)
}

// Rollback, deferred with the freeze's named error, runs the undo steps in reverse when *errp is
// set and the window is still open, and adds their failures to *errp. It runs under a ctx of its
// own, bounded by RollbackTimeout, so a Ctrl-C still resumes the source.
func (w *PauseWindow) Rollback(ctx context.Context, errp *error) {
	if *errp == nil || len(w.undo) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RollbackTimeout)
	defer cancel()
	for i := len(w.undo) - 1; i >= 0; i-- {
		if uerr := w.undo[i](rctx); uerr != nil {
			if i == 0 {
				*errp = fmt.Errorf("%w; resuming failed too: %v: %w", *errp, uerr, w.src.StillPaused)
			} else {
				*errp = fmt.Errorf("%w; rollback: %v", *errp, uerr)
			}
		}
	}
}

// SaveRAM gives a template its RAM file at dst, in the window. A source whose RAM file src is
// shared with its QEMU has it copied (children map the copy); otherwise the device state carried
// the guest's RAM, and dst only has to exist, sized sizeBytes. It returns the bytes copied.
func SaveRAM(ctx context.Context, src, dst string, shared bool, sizeBytes int64) (int64, error) {
	if !shared {
		return 0, CreateEmpty(dst, sizeBytes)
	}
	st, err := Freeze(ctx, src, dst)
	if err != nil {
		return 0, err
	}
	return st.CopiedBytes, nil
}
