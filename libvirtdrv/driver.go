//go:build cgo

package libvirtdrv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/templates"
)

// Name is the driver's name in machine records.
const Name = "libvirt"

// migrationPoll is how often query-migrate is asked; a device-state save or
// load takes tens of milliseconds.
const migrationPoll = 2 * time.Millisecond

// Driver runs machines as libvirt domains. It is safe for concurrent use: a
// libvirt connection serializes nothing that vmfork needs serialized.
type Driver struct {
	uri  string
	conn *libvirt.Connect
	log  *logrus.Entry
	// QEMUConf is the qemu.conf of the libvirtd behind uri; its
	// memory_backing_dir tells the start hook where a child's RAM goes.
	QEMUConf string
	// StopGrace bounds each polite step of Stop (guest agent, then ACPI).
	StopGrace time.Duration
	// AgentTimeout bounds waiting for a guest agent that should answer.
	AgentTimeout time.Duration
	// BootTimeout bounds a boot's wait for the guest agent when the
	// command gives no deadline of its own (--timeout): long enough for a
	// systemd guest under TCG on a loaded host, as the embedded driver's.
	BootTimeout time.Duration
}

var (
	_ vmfork.Driver     = (*Driver)(nil)
	_ vmfork.Forker     = (*Driver)(nil)
	_ vmfork.LinkSetter = (*Driver)(nil)
	_ vmfork.Adopter    = (*Driver)(nil)
)

// New connects to the libvirt daemon at uri (such as qemu:///system) and
// returns a Driver that logs to log (nil discards).
func New(uri string, log *logrus.Entry) (*Driver, error) {
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = logrus.NewEntry(l)
	}
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return nil, fmt.Errorf("connect to libvirt at %s: %w", uri, wrap(err))
	}
	return &Driver{
		uri: uri, conn: conn, log: log.WithField("driver", Name), QEMUConf: DefaultQEMUConf,
		StopGrace: 10 * time.Second, AgentTimeout: 30 * time.Second, BootTimeout: 5 * time.Minute,
	}, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Close closes the connection. Idempotent.
func (d *Driver) Close() error {
	if d.conn == nil {
		return nil
	}
	_, err := d.conn.Close()
	d.conn = nil
	return wrap(err)
}

// Name implements vmfork.Driver.
func (d *Driver) Name() string { return Name }

// Start implements vmfork.Driver: it creates m's domain, transient (vmfork's
// record is the machine's definition; libvirt forgets a transient domain when
// it stops, so nothing stale stays defined), and waits for the guest agent.
func (d *Driver) Start(ctx context.Context, m *vmfork.Machine) (err error) {
	if len(m.Spec.Devices)+len(m.Spec.Objects) > 0 {
		// A libvirt domain's devices are its XML's: add a <hostdev> to an
		// adopted domain instead.
		return fmt.Errorf("machine %q: --device and --object are for the embedded driver: %w", m.Name, vmfork.ErrInvalid)
	}
	if err := d.CheckNetwork(ctx, m); err != nil {
		return err
	}
	if err := d.resolve(ctx, m); err != nil {
		return err
	}
	if err := d.checkNameFree(m); err != nil {
		return err
	}
	if m.Spec.Disk != "" {
		if _, err := os.Stat(m.Paths.Disk); errors.Is(err, fs.ErrNotExist) {
			if err := overlay.Create(ctx, m.Spec.Disk, m.Paths.Disk); err != nil {
				return fmt.Errorf("create disk overlay: %w", err)
			}
		}
	}
	x, err := BootXML(m, d.metadata(m, nil), BootOptions{User: user()}).Marshal()
	if err != nil {
		return fmt.Errorf("domain XML: %w", err)
	}
	dom, err := d.conn.DomainCreateXML(x, 0)
	if err != nil {
		return fmt.Errorf("create domain %q: %w", m.Name, wrap(err))
	}
	defer dom.Free()
	defer func() {
		if err != nil {
			d.destroy(dom)
			m.PID = 0
		}
	}()
	if err := d.started(ctx, dom, m); err != nil {
		return err
	}
	wait := d.BootTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	a, err := d.agentWithin(ctx, dom, m, wait)
	if err != nil {
		return err
	}
	a.Close()
	return nil
}

// resolve fills in what the record leaves to the host: accelerator,
// versioned machine type, CPU model, MAC and free host ports. Fields already
// set (a fork child's inherited configuration) are kept.
func (d *Driver) resolve(ctx context.Context, m *vmfork.Machine) error {
	if m.Accel == "" {
		accel, err := templates.ChooseAccel(d.log.WithField("machine", m.Name))
		if err != nil {
			return err
		}
		m.Accel = accel
	}
	if m.Spec.MachineType == "" {
		// libvirt's answer, not QEMU's: libvirt runs the QEMU binary it chooses.
		mt, err := d.machineType(ctx, m.Accel)
		if err != nil {
			return err
		}
		m.Spec.MachineType = mt
	}
	// libvirt's type='user' interface forwards ports only with the passt
	// backend; vmfork adds slirp forwards over QMP once QEMU runs.
	return m.Spec.FillProfile()
}

// machineType asks libvirt what "q35" stands for: records keep the versioned
// type (pc-q35-7.2 on Debian 12), since a template loads only into it.
func (d *Driver) machineType(ctx context.Context, accel string) (string, error) {
	virt := domainTCG
	if accel == accelKVM {
		virt = domainKVM
	}
	x, err := d.conn.GetDomainCapabilities("", domainArch, "q35", virt, 0)
	if err != nil {
		return "", fmt.Errorf("domain capabilities: %w", wrap(err))
	}
	var caps libvirtxml.DomainCaps
	if err := caps.Unmarshal(x); err != nil {
		return "", fmt.Errorf("domain capabilities: %w", err)
	}
	if caps.Machine == "" {
		return "", fmt.Errorf("libvirt names no machine type for q35")
	}
	return caps.Machine, nil
}

// metadata is what m's domain carries in <metadata>; t is set for a child.
func (d *Driver) metadata(m *vmfork.Machine, t *vmfork.Template) Metadata {
	md := Metadata{Machine: m.Name, MachineDir: m.Paths.Dir, Parent: m.Parent, Template: m.Template}
	if t != nil {
		md.TemplateRAM, md.URI = t.Paths.RAM, d.uri
	}
	return md
}

// checkNameFree fails if a domain called m.Name runs: a foreign one (libvirt
// names are host-wide) or m's own, which would make Start start it twice.
func (d *Driver) checkNameFree(m *vmfork.Machine) error {
	dom, err := d.conn.LookupDomainByName(m.Name)
	if errors.Is(err, libvirt.ERR_NO_DOMAIN) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up domain %q: %w", m.Name, wrap(err))
	}
	defer dom.Free()
	if d.owns(dom, m) {
		return fmt.Errorf("domain %q is running already: %w", m.Name, vmfork.ErrInvalid)
	}
	return fmt.Errorf("a libvirt domain called %q exists and is not this machine: %w", m.Name, vmfork.ErrExists)
}

// started records what only a running domain tells: its QEMU pid, libvirt's
// log and where QEMU keeps guest RAM, and adds the port forwards.
func (d *Driver) started(ctx context.Context, dom *libvirt.Domain, m *vmfork.Machine) error {
	mon := d.monitor(dom, m)
	// libvirt owns QMP and the agent socket; both go through its API.
	m.Paths.QMP, m.Paths.QGA = "", ""
	m.Paths.Log = qemuLog(d.uri, m.Name, m.Paths.Log)
	m.PID = qemuPID(d.uri, m.Name)
	if m.Paths.RAMShared {
		var ram string
		if err := mon.Execute(ctx, "qom-get", map[string]string{"path": "/objects/" + ramAlias, "property": "mem-path"}, &ram); err != nil {
			return fmt.Errorf("find guest RAM file: %w", err)
		}
		m.Paths.RAM = ram
	}
	for _, p := range m.Spec.Ports {
		// hostnet0 is libvirt's netdev id of the first interface.
		hmp := fmt.Sprintf("hostfwd_add hostnet0 tcp:127.0.0.1:%d-:%d", p.Host, p.Guest)
		var out string
		if err := mon.Execute(ctx, "human-monitor-command", map[string]string{"command-line": hmp}, &out); err != nil {
			return fmt.Errorf("forward port %s: %w", p, err)
		}
		if out != "" {
			return fmt.Errorf("forward port %s: %s", p, out)
		}
	}
	return nil
}

func (d *Driver) monitor(dom *libvirt.Domain, m *vmfork.Machine) monitor {
	return monitor{dom: dom, log: d.log.WithField("machine", m.Name)}
}

// domain returns m's running domain, or nil when m has none. A domain of that
// name that is not m's counts as none: vmfork never touches it.
func (d *Driver) domain(m *vmfork.Machine) (*libvirt.Domain, error) {
	dom, err := d.conn.LookupDomainByName(m.Name)
	if errors.Is(err, libvirt.ERR_NO_DOMAIN) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up domain %q: %w", m.Name, wrap(err))
	}
	if !d.owns(dom, m) {
		dom.Free()
		return nil, nil
	}
	return dom, nil
}

// owns reports whether dom carries m's mark in its metadata or, for an
// adopted machine (which carries no mark: vmfork changes nothing of it), is
// the domain that was adopted.
func (d *Driver) owns(dom *libvirt.Domain, m *vmfork.Machine) bool {
	if m.Adopted != nil {
		uuid, err := dom.GetUUIDString()
		return err == nil && uuid == m.Adopted.ID
	}
	x, err := dom.GetMetadata(libvirt.DOMAIN_METADATA_ELEMENT, MetadataNS, libvirt.DOMAIN_AFFECT_LIVE)
	if err != nil {
		return false
	}
	md := parseMetadata(x)
	return md != nil && md.Machine == m.Name && filepath.Clean(md.MachineDir) == filepath.Clean(m.Paths.Dir)
}

// liveXML returns dom's live definition, parsed.
func liveXML(ctx context.Context, dom *libvirt.Domain, flags libvirt.DomainXMLFlags) (string, *libvirtxml.Domain, error) {
	x, err := call(ctx, dom, func(d *libvirt.Domain) (string, error) { return d.GetXMLDesc(flags) })
	if err != nil {
		return "", nil, fmt.Errorf("domain XML: %w", err)
	}
	def := &libvirtxml.Domain{}
	if err := def.Unmarshal(x); err != nil {
		return "", nil, fmt.Errorf("parse domain XML: %w", err)
	}
	return x, def, nil
}

// Status implements vmfork.Driver. A machine whose domain is gone (stopped
// through vmfork, or destroyed with virsh: vmfork's domains are transient)
// is stopped.
func (d *Driver) Status(ctx context.Context, m *vmfork.Machine) (vmfork.State, error) {
	dom, err := d.domain(m)
	if err != nil || dom == nil {
		return vmfork.StateStopped, err
	}
	defer dom.Free()
	st, _, err := dom.GetState()
	if errors.Is(err, libvirt.ERR_NO_DOMAIN) {
		return vmfork.StateStopped, nil
	}
	if err != nil {
		return "", fmt.Errorf("domain %q state: %w", m.Name, wrap(err))
	}
	switch st {
	case libvirt.DOMAIN_RUNNING, libvirt.DOMAIN_BLOCKED:
		return vmfork.StateRunning, nil
	case libvirt.DOMAIN_PAUSED, libvirt.DOMAIN_PMSUSPENDED:
		return vmfork.StatePaused, nil
	}
	return vmfork.StateStopped, nil
}

// Agent implements vmfork.Driver: the guest agent through libvirt
// (virDomainQemuAgentCommand). It returns once the agent answers a ping,
// retrying for up to AgentTimeout: after a fork libvirt may see the child's
// agent channel connect a moment after the guest runs.
func (d *Driver) Agent(ctx context.Context, m *vmfork.Machine) (*qmp.Agent, error) {
	dom, err := d.domain(m)
	if err != nil {
		return nil, err
	}
	if dom == nil {
		return nil, fmt.Errorf("machine %q: %w", m.Name, vmfork.ErrNotRunning)
	}
	defer dom.Free()
	return d.agent(ctx, dom, m)
}

func (d *Driver) agent(ctx context.Context, dom *libvirt.Domain, m *vmfork.Machine) (*qmp.Agent, error) {
	return d.agentWithin(ctx, dom, m, d.AgentTimeout)
}

// agentWithin is agent with its own bound on the wait.
func (d *Driver) agentWithin(ctx context.Context, dom *libvirt.Domain, m *vmfork.Machine, wait time.Duration) (*qmp.Agent, error) {
	if err := dom.Ref(); err != nil {
		return nil, wrap(err)
	}
	a := qmp.NewAgent(&agentTransport{dom: dom}, qmp.WithLogger(d.log.WithField("machine", m.Name)))
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
		err := a.Ping(pctx)
		pcancel()
		if err == nil {
			return a, nil
		}
		if errors.Is(err, libvirt.ERR_NO_DOMAIN) || errors.Is(err, libvirt.ERR_OPERATION_INVALID) {
			a.Close()
			return nil, fmt.Errorf("guest agent of %q: domain is not running: %w", m.Name, err)
		}
		select {
		case <-ctx.Done():
			a.Close()
			return nil, fmt.Errorf("guest agent of %q does not answer: %w (last error: %v)", m.Name, ctx.Err(), err)
		case <-t.C:
		}
	}
}

// Stop implements vmfork.Driver: a shutdown through the guest agent, then the
// ACPI power button, each waited for up to StopGrace, then destroy. With
// force it destroys at once. A machine without a domain is stopped already.
func (d *Driver) Stop(ctx context.Context, m *vmfork.Machine, force bool) error {
	dom, err := d.domain(m)
	if err != nil {
		return err
	}
	if dom != nil {
		defer dom.Free()
		if err := d.stop(ctx, dom, m, force); err != nil {
			return err
		}
	}
	if m.Paths.Disk != "" {
		overlay.RemoveOldTops(m.Paths.Dir, m.Paths.Disk)
	}
	return nil
}

func (d *Driver) stop(ctx context.Context, dom *libvirt.Domain, m *vmfork.Machine, force bool) error {
	if !force {
		for _, how := range []libvirt.DomainShutdownFlags{libvirt.DOMAIN_SHUTDOWN_GUEST_AGENT, libvirt.DOMAIN_SHUTDOWN_ACPI_POWER_BTN} {
			if _, err := call(ctx, dom, func(d *libvirt.Domain) (struct{}, error) { return struct{}{}, d.ShutdownFlags(how) }); err != nil {
				d.log.WithField("machine", m.Name).WithError(err).Debug("shutdown request failed")
				continue
			}
			if d.waitGone(ctx, dom, d.StopGrace) {
				return nil
			}
		}
	}
	return d.destroy(dom)
}

// destroy kills dom's QEMU; a domain that is gone already is no error.
func (d *Driver) destroy(dom *libvirt.Domain) error {
	err := dom.Destroy()
	if err == nil || errors.Is(err, libvirt.ERR_NO_DOMAIN) || errors.Is(err, libvirt.ERR_OPERATION_INVALID) {
		return nil
	}
	return fmt.Errorf("destroy domain: %w", wrap(err))
}

// waitGone waits up to grace for dom to stop running.
func (d *Driver) waitGone(ctx context.Context, dom *libvirt.Domain, grace time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		active, err := dom.IsActive()
		if err != nil || !active {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}
