package sharedmem

import (
	"context"
	"fmt"
	"time"
)

// Recipe is the part of a freeze that runs while the source is paused, the
// same for both drivers: pause, switch the disk, save the device state, give
// the template its RAM (Plan), resume. Each driver prepares everything
// before (the next overlay, the device-state file, the RAM plan, every check)
// and hands the steps that differ between them as functions. A failure at
// any step resumes the source through the window's undo stack.
type Recipe struct {
	Source PauseSource
	// SwitchDisk moves the source onto its next overlay; nil without a
	// disk. It pushes its own undo steps on w, and calls w.Keep once the
	// switch stands.
	SwitchDisk func(ctx context.Context, w *PauseWindow) error
	// SaveDeviceState writes the device state (x-ignore-shared set).
	SaveDeviceState func(ctx context.Context) error
	// QMP reaches the source's QEMU, asked for its run state after the
	// save (settled).
	QMP Monitor
	RAM *Plan
	// AfterRAM, when set, finishes the template's RAM file (its owner).
	AfterRAM func(ctx context.Context) error
	// Paused, when set, runs once the device state is saved (a crash test's
	// fault point).
	Paused func()
	// LeavePaused leaves the source paused once the template is whole, for
	// a caller that ends the source next (hibernate): nothing the guest did
	// after the instant could then be seen and lost. That caller resumes
	// the source on any later failure.
	LeavePaused bool
}

// Frozen is what a Recipe cost the source.
type Frozen struct {
	Pause time.Duration
	// CopiedBytes were copied while the source was paused.
	CopiedBytes int64
	// PhasesMS times the steps inside the pause, for the debug log.
	PhasesMS map[string]float64
}

// Run runs the recipe. On error the source runs again, unless the error
// wraps Source.StillPaused.
func (r Recipe) Run(ctx context.Context) (fr Frozen, err error) {
	w, err := Pause(ctx, r.Source)
	if err != nil {
		return fr, err
	}
	defer w.Rollback(ctx, &err)
	fr.PhasesMS = map[string]float64{}
	last := time.Now()
	mark := func(name string) {
		now := time.Now()
		fr.PhasesMS[name] = float64(now.Sub(last).Microseconds()) / 1000
		last = now
	}
	if err := Inject(InjectAfterStop); err != nil {
		return fr, err
	}
	if r.SwitchDisk != nil {
		if err := r.SwitchDisk(ctx, w); err != nil {
			return fr, fmt.Errorf("switch disk: %w", err)
		}
	}
	mark("disk_ms")
	if err := r.SaveDeviceState(ctx); err != nil {
		return fr, fmt.Errorf("save device state: %w", err)
	}
	if err := settled(ctx, r.QMP); err != nil {
		return fr, fmt.Errorf("save device state: %w", err)
	}
	mark("devstate_ms")
	if r.Paused != nil {
		r.Paused()
	}
	if err := Inject(InjectBeforeRAM); err != nil {
		return fr, err
	}
	if fr.CopiedBytes, err = r.RAM.InPause(ctx, w); err != nil {
		return fr, fmt.Errorf("freeze RAM (%v): %w", r.RAM.Mode, err)
	}
	if r.AfterRAM != nil {
		if err := r.AfterRAM(ctx); err != nil {
			return fr, err
		}
	}
	mark("ram_ms")
	if err := Inject(InjectAfterRAM); err != nil {
		return fr, err
	}
	if r.LeavePaused {
		fr.Pause = w.Leave()
		return fr, nil
	}
	if fr.Pause, err = w.Resume(ctx); err != nil {
		return fr, err
	}
	mark("cont_ms")
	return fr, nil
}

// Phases returns PhasesMS as log fields (logrus.Fields is this map type).
func (f Frozen) Phases() map[string]any {
	m := make(map[string]any, len(f.PhasesMS))
	for k, v := range f.PhasesMS {
		m[k] = v
	}
	return m
}

// settleTimeout bounds the wait for QEMU to leave finish-migrate.
const settleTimeout = 5 * time.Second

// settled waits until the QEMU behind mon has left the finish-migrate run
// state. QEMU 7.2 reports a save completed (query-migrate) a moment before its
// migration thread moves the VM from finish-migrate to postmigrate, and a cont
// in between fails with "Migration is not finalized yet": a freeze that copies
// no RAM resumes soon enough to hit that (seen on libvirt, one fork in five).
func settled(ctx context.Context, mon Monitor) error {
	if mon == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	for {
		var st struct {
			Status string `json:"status"`
		}
		if err := mon.Execute(ctx, "query-status", nil, &st); err != nil {
			return fmt.Errorf("query run state: %w", err)
		}
		if st.Status != "finish-migrate" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("QEMU still finishing the save: %w", ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}
