//go:build linux && amd64

package sharedmem

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// rollbackCase is one failure of a step of the paused part of a freeze.
type rollbackCase struct {
	name      string
	disk, dev error
	after     error
	want      error // the failure the error wraps
	wantUndo  bool  // the disk switch's undo step runs
}

var errBoom = errors.New("boom")

// TestRecipeRollsBack fails each step of the paused part of a freeze in
// turn: the source is always resumed, the disk switch's own undo runs, the
// template's RAM file never stays, and the error names the step. The
// failures between steps are injected in the failpoints build
// (TestRecipeRollsBackInjected).
func TestRecipeRollsBack(t *testing.T) {
	for _, c := range []rollbackCase{
		{name: "disk switch", disk: errBoom, want: errBoom},
		{name: "device state", dev: errBoom, want: errBoom, wantUndo: true},
		{name: "after RAM", after: errBoom, want: errBoom, wantUndo: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			noInjection(t)
			testRollback(t, c)
		})
	}
	t.Run("success", func(t *testing.T) {
		noInjection(t)
		r := &recorder{}
		tpl := filepath.Join(t.TempDir(), "t.ram")
		plan, _ := Prepare(t.Context(), &fakeMonitor{}, PlanRequest{SizeBytes: 1 << 20, Template: tpl})
		fr, err := Recipe{Source: r.source(), SaveDeviceState: func(context.Context) error { return nil }, RAM: plan}.Run(t.Context())
		if err != nil || fr.Pause <= 0 || len(fr.PhasesMS) != 4 {
			t.Fatalf("Run = %+v, %v; want a pause and four phases", fr, err)
		}
		if !slices.Equal(r.log, []string{"pause", "resume"}) {
			t.Errorf("steps %v, want pause, resume", r.log)
		}
		if _, err := os.Stat(tpl); err != nil {
			t.Errorf("template RAM file: %v", err)
		}
	})
}

// testRollback runs the recipe with c's failure and checks the rollback.
func testRollback(t *testing.T, c rollbackCase) {
	r := &recorder{}
	tpl := filepath.Join(t.TempDir(), "t.ram")
	plan, err := Prepare(t.Context(), &fakeMonitor{}, PlanRequest{SizeBytes: 1 << 20, Template: tpl})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Recipe{
		Source: r.source(),
		SwitchDisk: func(_ context.Context, w *PauseWindow) error {
			if c.disk != nil {
				return c.disk
			}
			w.OnFailure(r.step("undo disk"))
			return nil
		},
		SaveDeviceState: func(context.Context) error { return c.dev },
		RAM:             plan,
		AfterRAM:        func(context.Context) error { return c.after },
	}.Run(t.Context())
	if err == nil {
		t.Fatal("Run succeeded, want the failure")
	}
	if !errors.Is(err, c.want) {
		t.Errorf("error %v does not wrap the failure", err)
	}
	if got := r.log[len(r.log)-1]; got != "resume" {
		t.Errorf("steps %v: the source was not resumed last", r.log)
	}
	if slices.Contains(r.log, "undo disk") != c.wantUndo {
		t.Errorf("steps %v: disk switch undone = %v, want %v", r.log, !c.wantUndo, c.wantUndo)
	}
	if _, err := os.Stat(tpl); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("template RAM file left (%v)", err)
	}
}

// TestRecipeLeavePaused: a freeze for a hibernate keeps the source paused
// once the template is whole; a failure before that still resumes it.
func TestRecipeLeavePaused(t *testing.T) {
	noInjection(t)
	for _, fail := range []bool{false, true} {
		r := &recorder{}
		plan, err := Prepare(t.Context(), &fakeMonitor{}, PlanRequest{SizeBytes: 1 << 20, Template: filepath.Join(t.TempDir(), "t.ram")})
		if err != nil {
			t.Fatal(err)
		}
		var dev error
		if fail {
			dev = errors.New("boom")
		}
		fr, err := Recipe{Source: r.source(), SaveDeviceState: func(context.Context) error { return dev }, RAM: plan, LeavePaused: true}.Run(t.Context())
		switch {
		case !fail && (err != nil || fr.Pause <= 0 || !slices.Equal(r.log, []string{"pause"})):
			t.Errorf("LeavePaused: %+v, %v, steps %v; want the source left paused after a measured pause", fr, err, r.log)
		case fail && (err == nil || !slices.Equal(r.log, []string{"pause", "resume"})):
			t.Errorf("LeavePaused, failed save: %v, steps %v; want the source resumed", err, r.log)
		}
	}
}

// statusMonitor answers query-status with finish-migrate n times, then
// postmigrate, as QEMU does right after a save completed.
type statusMonitor struct {
	fakeMonitor
	n int
}

func (m *statusMonitor) Execute(_ context.Context, cmd string, _, result any) error {
	m.cmds = append(m.cmds, cmd)
	st := "postmigrate"
	if m.n > 0 {
		m.n--
		st = "finish-migrate"
	}
	return json.Unmarshal([]byte(`{"status": "`+st+`"}`), result)
}

// TestRecipeWaitsForSaveToSettle: the source is resumed only once QEMU has
// left finish-migrate (a cont before that fails).
func TestRecipeWaitsForSaveToSettle(t *testing.T) {
	noInjection(t)
	mon := &statusMonitor{n: 3}
	resumedEarly := false
	src := PauseSource{
		Pause:       func(context.Context) error { return nil },
		Resume:      func(context.Context) error { resumedEarly = mon.n > 0; return nil },
		StillPaused: errStillPaused,
	}
	plan, _ := Prepare(t.Context(), mon, PlanRequest{SizeBytes: 1 << 20, Template: filepath.Join(t.TempDir(), "t.ram")})
	if _, err := (Recipe{Source: src, QMP: mon, SaveDeviceState: func(context.Context) error { return nil }, RAM: plan}).Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if resumedEarly || len(mon.cmds) != 4 {
		t.Errorf("resumed while finish-migrate: %v; query-status asked %d times, want 4", resumedEarly, len(mon.cmds))
	}
}
