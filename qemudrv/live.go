package qemudrv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
)

// The two QEMUs of fork --to's live path (root forkto_live.go,
// docs/TEMPLATES.md "The live path"): here, a QEMU loaded from the
// template as a child would be, left paused, that migrates (postcopy) to
// the child's QEMU on the other host, started -incoming with RAM of its
// own. The sequence is scripts/postcopy-from-template.py's, checked there
// with plain QEMUs.

var _ vmfork.LiveForker = (*Driver)(nil)

const (
	capPostcopy = "postcopy-ram"
)

func setCaps(ctx context.Context, mon *qmp.Monitor, caps map[string]bool) error {
	var list []qemustate.Capability
	for _, name := range []string{qemustate.CapXIgnoreShared, capPostcopy} {
		if on, ok := caps[name]; ok {
			list = append(list, qemustate.Capability{Name: name, State: on})
		}
	}
	return mon.Execute(ctx, qemustate.CmdMigrateSetCapabilities, map[string]any{"capabilities": list}, nil)
}

// loaded is a QEMU loaded from a template, paused (vmfork.LoadedTemplate).
type loaded struct {
	d *Driver
	m *vmfork.Machine
}

// LoadTemplate implements vmfork.LiveForker: Prestart and the device
// state's load of a child (the template's RAM mapped share=off, so the
// template is never written), without the cont. Its machine is no
// machine of the store: it lives in dir, has no network of the host's, and is killed by
// Close. A template with extra disks is refused (its children's disks are
// made by the fork).
func (d *Driver) LoadTemplate(ctx context.Context, t *vmfork.Template, dir string) (_ vmfork.LoadedTemplate, err error) {
	if len(t.Disks) > 0 || len(t.Spec.Disks) > 0 {
		return nil, fmt.Errorf("template %s has extra disks, which the live path does not load: %w", t.ID, vmfork.ErrUnsupported)
	}
	spec := t.Spec
	// User networking with no forwards: the NIC's device (the manifest
	// compares it) with a backend that touches nothing on the host; the
	// loaded VM never runs anyway.
	spec.Network, spec.Ports = vmfork.Network{Kind: vmfork.NetworkUser}, nil
	m := &vmfork.Machine{Name: "fork-to-loaded", Driver: t.Driver, Accel: t.Accel, Spec: spec, VMGenID: t.VMGenID,
		Paths: vmfork.Paths{Dir: dir, QMP: filepath.Join(dir, "qmp.sock"), QGA: filepath.Join(dir, "qga.sock"),
			Serial: filepath.Join(dir, "serial.log"), Log: filepath.Join(dir, "qemu.log")}}
	if t.Paths.Disk != "" {
		m.Paths.Disk = filepath.Join(dir, "disk.qcow2")
		// Never written: the loaded VM never runs, and the migration
		// inactivates its disk at the end.
		if err := overlay.Create(ctx, t.Paths.Disk, m.Paths.Disk); err != nil {
			return nil, err
		}
	}
	// The loaded QEMU serves this command alone: if vmfork is killed
	// mid-transfer, it goes too, never left paused behind it.
	if err := d.Prestart(withDieWithCLI(ctx), m, t); err != nil {
		return nil, fmt.Errorf("load template %s: %w", t.ID, err)
	}
	l := &loaded{d: d, m: m}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	mon, err := qmp.Dial(ctx, m.Paths.QMP)
	if err != nil {
		return nil, fmt.Errorf("load template %s: connect to QMP: %w", t.ID, err)
	}
	defer mon.Close()
	if err := qemustate.LoadDeviceState(ctx, mon, devStateFD, t.Paths.DevState, migrationPoll, nil); err != nil {
		return nil, fmt.Errorf("load template %s: device state: %w", t.ID, err)
	}
	return l, nil
}

// Migrate implements vmfork.LoadedTemplate: postcopy migration to the
// QEMU listening at (the forward of) unix socket sock, switched to
// postcopy at once, so that the other end runs as soon as the device state
// is there; it returns once the migration completed. started is called
// once the other end may run.
func (l *loaded) Migrate(ctx context.Context, sock string, opt vmfork.MigrateOptions, started func()) (vmfork.MigrationStats, error) {
	var st vmfork.MigrationStats
	mon, err := qmp.Dial(ctx, l.m.Paths.QMP)
	if err != nil {
		return st, fmt.Errorf("migrate: connect to QMP: %w", err)
	}
	defer mon.Close()
	// Postcopy refuses x-ignore-shared ("Postcopy is not compatible with
	// ignore-shared"); with it off the whole RAM goes, which is the point.
	if err := setCaps(ctx, mon, map[string]bool{qemustate.CapXIgnoreShared: false, capPostcopy: true}); err != nil {
		return st, fmt.Errorf("migrate: capabilities: %w", err)
	}
	ps, err := qemustate.Postcopy(ctx, mon, "unix:"+sock, opt.MaxBandwidth, opt.PrecopyFor, started)
	return vmfork.MigrationStats{Status: ps.Status, Bytes: ps.Bytes, SwitchoverMS: ps.SwitchoverMS, TotalMS: ps.TotalMS}, err
}

// Close implements vmfork.LoadedTemplate: the loaded QEMU is killed and
// its files removed.
func (l *loaded) Close() {
	if l.m.PID != 0 {
		l.d.procs.signal(l.m.PID, syscall.SIGKILL)
		wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l.d.procs.waitGone(wctx, l.m.PID, l.m.Paths.QMP)
		cancel()
	}
	os.RemoveAll(l.m.Paths.Dir)
}

// StartIncoming implements vmfork.LiveForker: child's QEMU with the
// template's devices, RAM of its own (the child's share=on file, as a
// booted machine's: it is a fork source in turn), -incoming on unix socket
// sock with postcopy-ram, kept paused (-S) whatever the stream says. It
// calls listening once QEMU listens, waits until the other end switched to
// postcopy (or completed), puts the NIC's link down and lets it run. On
// error no process of child is left.
func (d *Driver) StartIncoming(ctx context.Context, child *vmfork.Machine, t *vmfork.Template, sock string, listening func() error) (err error) {
	bin, err := d.qemuBinary()
	if err != nil {
		return err
	}
	if err := vmfork.PickPorts(child.Spec.Ports); err != nil {
		return err
	}
	p, err := d.spawnMachine(ctx, bin, child, ArgvOptions{Incoming: true, DevicesOnly: t.Manifest.DevStateFormat != "", Paused: true})
	if err != nil {
		return err
	}
	child.PID = p.pid
	defer func() {
		if err != nil {
			p.kill()
			child.PID = 0
		}
	}()
	mon, err := dialQMP(ctx, child.Paths.QMP, p, child.Paths.Log, d.log.WithField("machine", child.Name))
	if err != nil {
		return err
	}
	defer mon.Close()
	got := manifestOf(child, mon.Greeting())
	got.RAMSharedWithChildren, got.DevStateBytes = t.Manifest.RAMSharedWithChildren, t.Manifest.DevStateBytes
	got.DevStateFormat = t.Manifest.DevStateFormat
	if err := got.Check(t.Manifest); err != nil {
		return err
	}
	if err := setCaps(ctx, mon, map[string]bool{capPostcopy: true}); err != nil {
		return fmt.Errorf("incoming: capabilities: %w", err)
	}
	if err := mon.Execute(ctx, qemustate.CmdMigrateIncoming, map[string]string{"uri": "unix:" + sock}, nil); err != nil {
		return fmt.Errorf("incoming: %w", err)
	}
	if err := listening(); err != nil {
		return err
	}
	// Paused (-S) once postcopy runs here or the whole stream is in.
	for {
		st, err := mon.QueryStatus(ctx)
		if err != nil {
			if errors.Is(err, qmp.ErrClosed) {
				time.Sleep(50 * time.Millisecond)
				return fmt.Errorf("incoming migration: %w", exitError(nil, child.Paths.Log))
			}
			return fmt.Errorf("incoming migration: %w", err)
		}
		if st.Status == "paused" || st.Status == "running" {
			break
		}
		var info qemustate.MigrationInfo
		if err := mon.Execute(ctx, qemustate.CmdQueryMigrate, nil, &info); err == nil && (info.Status == qemustate.MigrationFailed || info.Status == qemustate.MigrationPostcopyPaused) {
			return fmt.Errorf("incoming migration %s: %s", info.Status, info.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("incoming migration (%s): %w", st.Status, ctx.Err())
		case <-time.After(qemustate.PostcopyPoll):
		}
	}
	if err := mon.SetLink(ctx, nicID, false); err != nil {
		return fmt.Errorf("set link down: %w", err)
	}
	if err := mon.Cont(ctx); err != nil {
		return fmt.Errorf("resume child: %w", err)
	}
	return nil
}

// IncomingStatus implements vmfork.LiveForker: the incoming migration's
// state in m's QEMU ("" when QEMU is gone).
func (d *Driver) IncomingStatus(ctx context.Context, m *vmfork.Machine) (string, error) {
	if !d.procs.alive(m.PID, m.Paths.QMP) {
		return "", nil
	}
	mon, err := qmp.Dial(ctx, m.Paths.QMP)
	if err != nil {
		return "", err
	}
	defer mon.Close()
	var info qemustate.MigrationInfo
	if err := mon.Execute(ctx, qemustate.CmdQueryMigrate, nil, &info); err != nil {
		return "", err
	}
	return info.Status, nil
}

// dieWithCLIKey marks a context whose QEMU must not outlive this CLI
// (spawnOptions.dieWithCLI); Prestart passes it down to the spawn.
type dieWithCLIKey struct{}

func withDieWithCLI(ctx context.Context) context.Context {
	return context.WithValue(ctx, dieWithCLIKey{}, true)
}

func diesWithCLI(ctx context.Context) bool {
	v, _ := ctx.Value(dieWithCLIKey{}).(bool)
	return v
}
