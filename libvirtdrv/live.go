//go:build cgo

package libvirtdrv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
)

// fork --to's live path on libvirt (root forkto_live.go, docs/TEMPLATES.md
// "The live path", "libvirt's route"): here, a transient domain loaded from
// the template exactly as a child is (startChild, left paused), which
// migrates postcopy to the child's domain on the other host: a domain of
// that host's libvirtd, made from the same template XML by the same code
// (ChildXML), waiting with -incoming defer as every libvirt child does.
//
// Why QMP through libvirt's passthrough and not libvirt's migration API
// (virDomainMigrate3 + VIR_MIGRATE_POSTCOPY): libvirt's migration makes the
// destination domain itself, in its Prepare phase, from the XML the source
// daemon sends; the destination is then no domain vmfork started, with no
// -incoming defer before which vmfork checks its devices and puts its
// backend link down, and the whole live path (fork-serve --incoming
// making the child, its journal, the identity chain once it runs) would be
// libvirt's instead. It also needs the source daemon to reach the other
// daemon (qemu+ssh://, a second ssh login) and a data connection of its
// own (native migration opens a TCP port on the destination, 49152 on;
// --tunnelled cannot carry postcopy), where the live path has one ssh
// connection whose forwarded unix socket carries everything. With the
// passthrough both QEMUs get the same capabilities and commands as
// qemudrv/live.go, and the stream's socket is passed to each QEMU as a file
// descriptor (getfd, as for the device-state load): libvirt's QEMU, which
// runs without CAP_DAC_OVERRIDE, need not reach vmfork's sockets. libvirt
// neither refuses nor undoes a migration it did not start: the loaded
// domain is destroyed as usual after it (its log: "shutting down,
// reason=destroyed"), and the child, resumed through virDomainResume, is
// a running domain of that host's libvirtd (TestLibvirtForkTo checks
// `virsh domstate --reason`); both are tainted custom-monitor (and
// custom-argv for -incoming defer), as every vmfork child already is.

var _ vmfork.LiveForker = (*Driver)(nil)

const (
	capPostcopy = "postcopy-ram"
	liveFD      = "vmfork-live"
)

func setLiveCaps(ctx context.Context, mon monitor, caps ...qemustate.Capability) error {
	return mon.Execute(ctx, qemustate.CmdMigrateSetCapabilities, map[string]any{"capabilities": caps}, nil)
}

// loaded is a transient domain loaded from a template, paused
// (vmfork.LoadedTemplate).
type loaded struct {
	d *Driver
	m *vmfork.Machine
}

// LoadTemplate implements vmfork.LiveForker: a domain started from t as
// StartChild starts a child (the template's RAM mapped private, its device
// state loaded, its links down), left paused. It lives in dir, is no
// machine of the store, names no reaper, and is destroyed by Close, or by
// libvirtd when vmfork's connection closes (START_AUTODESTROY: a vmfork
// killed mid-transfer leaves no paused domain behind, and its migration,
// through ssh's forward, ends with it).
func (d *Driver) LoadTemplate(ctx context.Context, t *vmfork.Template, dir string) (_ vmfork.LoadedTemplate, err error) {
	if len(t.Disks) > 0 || len(t.Spec.Disks) > 0 {
		return nil, fmt.Errorf("template %s has extra disks, which the live path does not load: %w", t.ID, vmfork.ErrUnsupported)
	}
	var b [6]byte
	rand.Read(b[:])
	spec := t.Spec
	spec.Ports = nil
	m := &vmfork.Machine{Name: loadedName + hex.EncodeToString(b[:]), Driver: t.Driver, Accel: t.Accel, Spec: spec,
		VMGenID: t.VMGenID, Template: t.ID, Paths: vmfork.Paths{Dir: dir, Serial: filepath.Join(dir, "serial.log")}}
	if t.Paths.Disk != "" {
		// Never written: the loaded VM never runs, and the migration
		// inactivates its disk at the end.
		m.Paths.Disk = filepath.Join(dir, "disk.qcow2")
		if err := overlay.Create(ctx, t.Paths.Disk, m.Paths.Disk); err != nil {
			return nil, err
		}
	}
	if err := d.startChild(ctx, m, t, true); err != nil {
		return nil, fmt.Errorf("load template %s: %w", t.ID, err)
	}
	return &loaded{d: d, m: m}, nil
}

// loadedName starts the names of loaded domains.
const loadedName = "vmfork-loaded-"

// Migrate implements vmfork.LoadedTemplate: qemudrv/live.go's migration,
// through the passthrough, on the connection to sock passed as a file.
func (l *loaded) Migrate(ctx context.Context, sock string, opt vmfork.MigrateOptions, started func()) (vmfork.MigrationStats, error) {
	var st vmfork.MigrationStats
	dom, err := l.d.domain(l.m)
	if err != nil || dom == nil {
		return st, fmt.Errorf("migrate: loaded domain %s is gone: %v", l.m.Name, err)
	}
	defer dom.Free()
	mon := l.d.monitor(dom, l.m)
	// Postcopy refuses x-ignore-shared, which the load set.
	if err := setLiveCaps(ctx, mon, qemustate.Capability{Name: qemustate.CapXIgnoreShared, State: false}, qemustate.Capability{Name: capPostcopy, State: true}); err != nil {
		return st, fmt.Errorf("migrate: capabilities: %w", err)
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", sock)
	if err != nil {
		return st, fmt.Errorf("migrate: %w", err)
	}
	f, err := c.(*net.UnixConn).File()
	c.Close()
	if err != nil {
		return st, fmt.Errorf("migrate: %w", err)
	}
	err = qmp.GetFD(ctx, mon, liveFD, f)
	f.Close()
	if err != nil {
		return st, fmt.Errorf("migrate: pass the connection: %w", err)
	}
	ps, err := qemustate.Postcopy(ctx, mon, "fd:"+liveFD, opt.MaxBandwidth, opt.PrecopyFor, started)
	return vmfork.MigrationStats{Status: ps.Status, Bytes: ps.Bytes, SwitchoverMS: ps.SwitchoverMS, TotalMS: ps.TotalMS}, err
}

// Close implements vmfork.LoadedTemplate: the loaded domain is destroyed
// and its files removed.
func (l *loaded) Close() {
	if dom, err := l.d.domain(l.m); err == nil && dom != nil {
		l.d.destroy(dom)
		dom.Free()
	}
	os.RemoveAll(l.m.Paths.Dir)
}

// StartIncoming implements vmfork.LiveForker: child's domain from t's
// source XML as StartChild makes it, but with RAM of its own (a fresh file
// mapped shared: no template RAM here, and it is a fork source in turn),
// started paused with -incoming defer; its devices checked against t's
// manifest, its backend link down, postcopy-ram on. It listens on sock,
// calls listening, takes the one connection and passes it to QEMU for
// migrate-incoming; once QEMU is paused after the switch to postcopy (or
// the whole stream is in) it puts the NIC's link down and resumes it
// through libvirt. On error the domain is destroyed.
func (d *Driver) StartIncoming(ctx context.Context, child *vmfork.Machine, t *vmfork.Template, sock string, listening func() error) (err error) {
	// Pushed with the disks (pushDisks), its kernel and initrd pointed at
	// the pushed files (installImport).
	srcXML, err := os.ReadFile(filepath.Join(t.Paths.Dir, FileSourceXML))
	if err != nil {
		return fmt.Errorf("template %q: %w", t.ID, err)
	}
	if err := vmfork.PickPorts(child.Spec.Ports); err != nil {
		return err
	}
	md := d.metadata(child, t)
	md.TemplateRAM = "" // RAM of its own: nothing for the start hook to link
	def, err := ChildXML(string(srcXML), child, md)
	if err != nil {
		return fmt.Errorf("template %q: %w", t.ID, err)
	}
	def.MemoryBacking.MemoryAccess = &libvirtxml.DomainMemoryAccess{Mode: "shared"}
	if t.Manifest.DevStateFormat == vmfork.DevStateDevices {
		addDevicesOnlyArgs(def)
	}
	undoFilter, err := d.withContractFilter(ctx, child, def)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			undoFilter()
		}
	}()
	x, err := def.Marshal()
	if err != nil {
		return fmt.Errorf("domain XML: %w", err)
	}
	if err := d.checkNameFree(child); err != nil {
		return err
	}
	if err := child.PrepareLedgerSocket(); err != nil {
		return err
	}
	dom, err := d.conn.DomainCreateXML(x, libvirt.DOMAIN_START_PAUSED)
	if err != nil {
		return fmt.Errorf("create domain %q: %w", child.Name, wrap(err))
	}
	defer dom.Free()
	defer func() {
		if err != nil {
			d.destroy(dom)
			child.PID = 0
		}
	}()
	mon := d.monitor(dom, child)
	if err := d.checkManifest(ctx, dom, t); err != nil {
		return err
	}
	if _, err := d.backendLink(ctx, dom, mon, false); err != nil {
		return err
	}
	if err := setLiveCaps(ctx, mon, qemustate.Capability{Name: capPostcopy, State: true}); err != nil {
		return fmt.Errorf("incoming: capabilities: %w%s", err, postcopyHint(err))
	}
	if err := d.acceptIncoming(ctx, mon, sock, listening); err != nil {
		return err
	}
	if err := waitPostcopyRuns(ctx, mon); err != nil {
		if tail := logTail(qemuLog(d.uri, child.Name, ""), 3); tail != "" {
			err = fmt.Errorf("%w: %s", err, tail)
		}
		return err
	}
	if err := d.setLink(ctx, dom, false); err != nil {
		return fmt.Errorf("set link down: %w", err)
	}
	if err := d.started(ctx, dom, child); err != nil {
		return err
	}
	if err := resume(ctx, dom); err != nil {
		return fmt.Errorf("resume child: %w", err)
	}
	return nil
}

// postcopyHint says why QEMU 7.2 refuses postcopy-ram under libvirt, where
// it is the likely reason: its userfaultfd(2) needs CAP_SYS_PTRACE or
// vm.unprivileged_userfaultfd=1 (QEMU 7.2 has no /dev/userfaultfd). A
// child of vmfork's own domain runs as vmfork's user, root here, whose
// QEMU kept CAP_SYS_PTRACE under libvirt 9.0 (postcopy ran with the sysctl
// at 0); one of an adopted domain runs as libvirt's unprivileged user
// (its source's DAC label), which has no capabilities.
func postcopyHint(err error) string {
	var qe *qmp.Error
	// QEMU 7.2: "Postcopy is not supported" (migrate_caps_check).
	if !errors.As(err, &qe) || !strings.Contains(strings.ToLower(err.Error()), "postcopy") {
		return ""
	}
	if b, _ := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd"); len(b) > 0 && b[0] == '0' {
		return " (QEMU 7.2's postcopy needs userfaultfd(2): CAP_SYS_PTRACE in libvirt's QEMU, or vm.unprivileged_userfaultfd=1)"
	}
	return ""
}

// checkManifest checks that dom's guest-visible configuration is t's
// (checkChild's check; no template RAM to look for here).
func (d *Driver) checkManifest(ctx context.Context, dom *libvirt.Domain, t *vmfork.Template) error {
	_, mig, err := liveXML(ctx, dom, libvirt.DOMAIN_XML_MIGRATABLE)
	if err != nil {
		return err
	}
	got, err := d.manifest(&vmfork.Machine{Spec: vmfork.Spec{MemoryMiB: t.Manifest.MemoryMiB, CPUs: t.Manifest.CPUs}}, mig)
	if err != nil {
		return err
	}
	got.DevStateBytes, got.RAMSharedWithChildren = t.Manifest.DevStateBytes, t.Manifest.RAMSharedWithChildren
	got.DevStateFormat = t.Manifest.DevStateFormat
	return got.Check(t.Manifest)
}

// acceptIncoming listens on sock, calls listening, and hands the one
// connection that comes to QEMU for migrate-incoming.
func (d *Driver) acceptIncoming(ctx context.Context, mon monitor, sock string, listening func() error) error {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("incoming: %w", err)
	}
	defer ln.Close()
	if err := listening(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	c, err := ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fmt.Errorf("incoming: wait for the migration's connection: %w", err)
	}
	f, err := c.(*net.UnixConn).File()
	c.Close()
	if err != nil {
		return fmt.Errorf("incoming: %w", err)
	}
	err = qmp.GetFD(ctx, mon, liveFD, f)
	f.Close()
	if err != nil {
		return fmt.Errorf("incoming: pass the connection: %w", err)
	}
	if err := mon.Execute(ctx, qemustate.CmdMigrateIncoming, map[string]string{"uri": "fd:" + liveFD}, nil); err != nil {
		return fmt.Errorf("incoming: %w", err)
	}
	return nil
}

// waitPostcopyRuns returns once QEMU, started paused, is paused after the
// switch to postcopy or the whole stream.
func waitPostcopyRuns(ctx context.Context, mon monitor) error {
	for {
		var st struct {
			Status string `json:"status"`
		}
		if err := mon.Execute(ctx, "query-status", nil, &st); err != nil {
			return fmt.Errorf("incoming migration: %w", err)
		}
		if st.Status == "paused" || st.Status == "running" {
			return nil
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
}

// IncomingStatus implements vmfork.LiveForker: the incoming migration's
// state in m's QEMU ("" when its domain is gone).
func (d *Driver) IncomingStatus(ctx context.Context, m *vmfork.Machine) (string, error) {
	dom, err := d.domain(m)
	if err != nil || dom == nil {
		return "", err
	}
	defer dom.Free()
	var info qemustate.MigrationInfo
	if err := d.monitor(dom, m).Execute(ctx, qemustate.CmdQueryMigrate, nil, &info); err != nil {
		if active, aerr := dom.IsActive(); aerr == nil && !active {
			return "", nil
		}
		return "", err
	}
	return info.Status, nil
}
