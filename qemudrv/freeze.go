package qemudrv

// The freeze of the embedded driver: the pause window (sharedmem.PauseWindow)
// around the disk switch, the device-state save and the RAM plan that both
// drivers share (sharedmem.Plan: no RAM copy in the pause).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/sharedmem"
)

// ownRAM is the name under which machine m keeps the RAM file its QEMU maps:
// a booted machine's own file, and for a child the same place (the store
// removes it with the machine); a child starts without one.
func ownRAM(m *vmfork.Machine) string {
	if m.Paths.RAMShared {
		return m.Paths.RAM
	}
	return filepath.Join(filepath.Dir(m.Paths.RAM), m.Name+ramSuffix)
}

const (
	ramSuffix    = ".ram"
	ramTrackFile = "ram-track.json"
)

// prepareRAM plans, before the pause, how src's RAM becomes t's.
func prepareRAM(ctx context.Context, mon *qmp.Monitor, src *vmfork.Machine, t *vmfork.Template, opts vmfork.FreezeOptions, log *logrus.Entry) (*sharedmem.Plan, error) {
	shared, err := sharedmem.QOMShare(ctx, mon, ramID)
	if err != nil {
		return nil, err
	}
	req := sharedmem.PlanRequest{
		PID: src.PID, SizeBytes: int64(src.Spec.MemoryMiB) << 20, Shared: shared,
		RAM: src.Paths.RAM, Own: ownRAM(src), Template: t.Paths.RAM,
		Temp:   filepath.Join(filepath.Dir(t.Paths.RAM), "."+t.ID+ramSuffix+".tmp"),
		Suffix: ramSuffix,
	}
	if opts.Delta {
		// Named after the template, so that its removal, gc and a crashed
		// fork's repair find them (vmfork.DeltaPaths).
		req.Base, req.Delta = vmfork.DeltaPaths(t.Paths.RAM)
		// The machine's write tracking (sharedmem/track.go) lives and
		// goes with its directory.
		req.Track = filepath.Join(src.Paths.Dir, ramTrackFile)
		// This driver's children apply the whole chain (mapTemplate).
		req.Chain, req.Children = true, opts.Children
	}
	p, err := sharedmem.Prepare(ctx, mon, req)
	if err != nil {
		return nil, fmt.Errorf("machine %q: %w", src.Name, err)
	}
	if p.CopyReason != nil {
		log.WithError(p.CopyReason).Warn("no RAM remap here: the freeze copies the RAM file while paused")
	}
	return p, nil
}

// Freeze implements vmfork.Forker. Everything that can be prepared or checked
// is done before the source is paused; the pause covers only stop, the disk
// switch, the device-state save, the source's private pages (none on its
// first fork), the remap and cont.
func (d *Driver) Freeze(ctx context.Context, src *vmfork.Machine, t *vmfork.Template, opts vmfork.FreezeOptions) (fr vmfork.FreezeResult, err error) {
	if err := d.checkFreeze(src); err != nil {
		return fr, err
	}
	log := d.log.WithField("machine", src.Name)
	mon, err := qmp.Dial(ctx, src.Paths.QMP, qmp.WithLogger(log))
	if err != nil {
		return fr, fmt.Errorf("connect to QMP: %w", err)
	}
	defer mon.Close()
	replug, err := d.detachDevices(ctx, mon, src, t, opts.DetachDevices)
	if err != nil {
		return fr, err
	}
	defer replug(ctx) // runs after the source resumed (deferred before the pause)
	prep, err := d.prepareFreeze(ctx, mon, src, t)
	if err != nil {
		return fr, err
	}
	defer prep.cleanup()
	ram, err := prepareRAM(ctx, mon, src, t, opts, log)
	if err != nil {
		return fr, fmt.Errorf("prepare RAM: %w", err)
	}
	defer ram.Cleanup(ctx, mon)
	recipe := sharedmem.Recipe{
		Source:      sharedmem.PauseSource{Pause: mon.Stop, Resume: mon.Cont, StillPaused: vmfork.ErrStillPaused},
		RAM:         ram,
		Paused:      func() { vmfork.Fault(vmfork.FaultFreezePaused, src.PID) },
		LeavePaused: opts.LeavePaused,
	}
	release, err := d.prepareDevState(ctx, mon, src, t, ram, &recipe)
	if err != nil {
		return fr, err
	}
	defer release()
	if src.Spec.Disk != "" {
		recipe.SwitchDisk = func(ctx context.Context, w *sharedmem.PauseWindow) error {
			return switchDisk(ctx, mon, src, t, prep, w)
		}
	}
	frozen, err := recipe.Run(ctx)
	if err != nil {
		return fr, err
	}
	fr.Pause, fr.RAMCopiedBytes = frozen.Pause, frozen.CopiedBytes
	fr.RAMMode, fr.PrecopiedBytes = ram.Mode.String(), ram.Precopied
	if st, err := os.Stat(t.Paths.DevState); err == nil {
		t.Manifest.DevStateBytes = st.Size()
	}
	t.Manifest.RAMSharedWithChildren = ram.Mode != sharedmem.Stream
	if ram.Mode == sharedmem.Delta {
		base, pages := vmfork.DeltaPaths(t.Paths.RAM)
		held, _ := overlay.AllocatedBytes(pages)
		t.RAMDelta = &vmfork.RAMDelta{Base: base, Pages: pages, BaseOf: ram.DeltaBase, Bytes: held, Chain: ram.Chain()}
	}
	if ram.TrackErr != nil {
		log.WithError(ram.TrackErr).Debug("no write tracking: the next delta writes all private pages in the pause")
	}
	log.WithFields(logrus.Fields{
		"template": t.ID, "pause": fr.Pause, "ram_mode": ram.Mode.String(), "tracked": ram.Tracked(),
		"precopied_bytes": ram.Precopied, "paused_copy_bytes": fr.RAMCopiedBytes, "chain": len(ram.Chain()),
	}).WithFields(frozen.Phases()).Debug("frozen")
	return fr, nil
}

// prepareDevState readies the device-state save of r, before the pause
// (qemustate.PrepareDeviceState: the device sections alone when the template's RAM
// file will hold all of the guest's writable memory, else a migration
// stream), and records its format in t's manifest.
func (d *Driver) prepareDevState(ctx context.Context, mon *qmp.Monitor, src *vmfork.Machine, t *vmfork.Template, ram *sharedmem.Plan, r *sharedmem.Recipe) (release func(), err error) {
	log := d.log.WithField("machine", src.Name)
	s, err := qemustate.PrepareDeviceState(ctx, mon, t.Paths.DevState, devStateFD, ramID, ram.Mode != sharedmem.Stream, migrationPoll, log)
	if err != nil {
		return nil, err
	}
	r.SaveDeviceState = s.Save
	switch {
	case s.DevicesOnly:
		t.Manifest.DevStateFormat = vmfork.DevStateDevices
	case d.procs.alive(src.PID, qemustate.DevicesOnlyArgs[1]):
		// A child of a devices-only template (its command line has
		// send-configuration=off) saves no configuration section; its
		// children must not expect one.
		t.Manifest.DevStateFormat = vmfork.DevStateNoConfig
		r.QMP = mon
	default:
		// A migration's end is reported before QEMU leaves finish-migrate.
		r.QMP = mon
	}
	return s.Release, nil
}

func (d *Driver) checkFreeze(src *vmfork.Machine) error {
	if !d.procs.alive(src.PID, src.Paths.QMP) {
		return fmt.Errorf("machine %q: %w", src.Name, vmfork.ErrNotRunning)
	}
	return nil
}

// childRAM prepares the RAM of a child m of template t: its QEMU maps a
// fresh, empty file share=on (so that its own forks are ramDiff, not
// ramStream), which mapTemplate then replaces with a private mapping of the
// template before any state is loaded. It returns the machine to build the
// argv from and that file's name. Without Remap the child maps the template
// share=off, as QEMU offers.
func childRAM(m *vmfork.Machine, t *vmfork.Template) (*vmfork.Machine, string, error) {
	if !sharedmem.RemapSupported {
		return m, "", nil
	}
	// Named after the template, so that a crash's leftover goes with it
	// (Store.RemoveTemplate).
	f, err := os.CreateTemp(filepath.Dir(t.Paths.RAM), "."+t.ID+ramSuffix+".tmp-start-*")
	if err != nil {
		return nil, "", fmt.Errorf("create start RAM file: %w", err)
	}
	f.Close()
	mm := *m
	mm.Paths.RAM, mm.Paths.RAMShared = f.Name(), true
	return &mm, f.Name(), nil
}

// mapTemplate remaps the RAM of child process pid, started on start
// (childRAM), privately onto template t's RAM file, and removes start. A
// delta template's child maps the base and gets the delta's pages written
// into its own copy-on-write pages here, before its device state loads
// (virtio's load reads the rings in guest RAM) and long before cont.
func mapTemplate(ctx context.Context, mon *qmp.Monitor, pid int, start string, t *vmfork.Template, sizeBytes int64, log *logrus.Entry) error {
	if start == "" {
		if t.RAMDelta != nil {
			return fmt.Errorf("template %q: its RAM is a delta, which needs the remap this build lacks: %w", t.ID, vmfork.ErrUnsupported)
		}
		return nil
	}
	defer os.Remove(start)
	if d := t.RAMDelta; d != nil {
		st, err := sharedmem.MapTemplateChain(ctx, mon, pid, start, d.Base, d.Files(), sizeBytes)
		if err != nil {
			return fmt.Errorf("template %q: %w", t.ID, err)
		}
		f := logrus.Fields(st.LogFields())
		f["template"], f["delta_depth"] = t.ID, d.Depth()
		log.WithFields(f).Debug("delta applied")
		return nil
	}
	return sharedmem.MapTemplate(ctx, mon, pid, start, t.Paths.RAM, sizeBytes)
}
