package sharedmem

import (
	"context"
	"errors"
	"slices"
	"testing"
)

var errStillPaused = errors.New("still paused")

// recorder is a source that records what was done to it, and fails resumes while failResume > 0.
type recorder struct {
	log        []string
	failResume int
}

func (r *recorder) source() PauseSource {
	return PauseSource{
		Pause: func(context.Context) error { r.log = append(r.log, "pause"); return nil },
		Resume: func(context.Context) error {
			r.log = append(r.log, "resume")
			if r.failResume > 0 {
				r.failResume--
				return errors.New("resume failed")
			}
			return nil
		},
		StillPaused: errStillPaused,
	}
}

func (r *recorder) step(name string) func(context.Context) error {
	return func(context.Context) error { r.log = append(r.log, name); return nil }
}

// freezeWith runs a freeze whose body is fn, the way a driver's Freeze does.
func freezeWith(r *recorder, fn func(w *PauseWindow) error) (err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := Pause(ctx, r.source())
	if err != nil {
		return err
	}
	defer w.Rollback(ctx, &err)
	cancel() // a Ctrl-C mid-freeze: the rollback must still run
	return fn(w)
}

func TestRollbackUndoesInReverseAndResumes(t *testing.T) {
	r := &recorder{}
	err := freezeWith(r, func(w *PauseWindow) error {
		w.OnFailure(r.step("undo link"))
		w.OnFailure(r.step("undo node"))
		return errors.New("save failed")
	})
	want := []string{"pause", "undo node", "undo link", "resume"}
	if err == nil || errors.Is(err, errStillPaused) || !slices.Equal(r.log, want) {
		t.Fatalf("got %v, %v; want %v and an error without StillPaused", r.log, err, want)
	}
}

func TestKeepDropsUndoStepsButResumes(t *testing.T) {
	r := &recorder{}
	freezeWith(r, func(w *PauseWindow) error {
		w.OnFailure(r.step("undo link"))
		w.Keep()
		return errors.New("save failed")
	})
	if want := []string{"pause", "resume"}; !slices.Equal(r.log, want) {
		t.Fatalf("got %v, want %v", r.log, want)
	}
}

func TestResumeFailureIsStillPaused(t *testing.T) {
	r := &recorder{failResume: 2}
	err := freezeWith(r, func(w *PauseWindow) error {
		_, err := w.Resume(context.Background())
		return err
	})
	if !errors.Is(err, errStillPaused) || !slices.Equal(r.log, []string{"pause", "resume", "resume"}) {
		t.Fatalf("got %v, %v; want StillPaused after a second resume attempt", r.log, err)
	}
}

// TestResumeRetried: a resume that fails once and works when Rollback tries
// again fails the freeze, but does not say the source is still paused.
func TestResumeRetried(t *testing.T) {
	r := &recorder{failResume: 1}
	err := freezeWith(r, func(w *PauseWindow) error {
		_, err := w.Resume(context.Background())
		return err
	})
	if err == nil || errors.Is(err, errStillPaused) || !slices.Equal(r.log, []string{"pause", "resume", "resume"}) {
		t.Fatalf("got %v, %v; want a failure without StillPaused after the second resume worked", r.log, err)
	}
}

func TestSuccessRunsNoUndo(t *testing.T) {
	r := &recorder{}
	err := freezeWith(r, func(w *PauseWindow) error {
		w.OnFailure(r.step("undo link"))
		_, err := w.Resume(context.Background())
		return err
	})
	if err != nil || !slices.Equal(r.log, []string{"pause", "resume"}) {
		t.Fatalf("got %v, %v; want one resume and no undo", r.log, err)
	}
}
