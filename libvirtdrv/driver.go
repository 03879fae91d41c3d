//go:build cgo

package libvirtdrv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/profile"
	"github.com/vmfork/vmfork/qmp"
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

	callTimeout time.Duration
}

var (
	_ vmfork.Driver     = (*Driver)(nil)
	_ vmfork.Forker     = (*Driver)(nil)
	_ vmfork.LinkSetter = (*Driver)(nil)
	_ vmfork.Adopter    = (*Driver)(nil)
)

// DefaultCallTimeout bounds how long vmfork waits for a libvirt daemon that
// does not answer at all (hung, or stopped with SIGSTOP): the connection
// (virConnectOpen) and then, through libvirt's keepalive, every call on it.
// A slow answer is not a hung daemon: libvirtd answers keepalive pings from
// its event loop while a worker thread runs a long call, so a call that
// takes minutes (a re-probe of QEMU, a domain start under TCG) is not cut.
const DefaultCallTimeout = 30 * time.Second

// TimeoutEnv overrides DefaultCallTimeout (a Go duration, such as 10s); tests
// set it short.
const TimeoutEnv = "VMFORK_LIBVIRT_TIMEOUT"

// keepaliveCount is how many unanswered keepalive pings close the
// connection; libvirt closes it interval*(count+1) after the last answer.
const keepaliveCount = 5

// Options tune a connection.
type Options struct {
	// CallTimeout is DefaultCallTimeout when 0.
	CallTimeout time.Duration
}

// New connects to the libvirt daemon at uri (such as qemu:///system) and
// returns a Driver that logs to log (nil discards). The call bound is
// $VMFORK_LIBVIRT_TIMEOUT, or DefaultCallTimeout.
func New(uri string, log *logrus.Entry) (*Driver, error) {
	var opts Options
	if v := os.Getenv(TimeoutEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%s=%q: want a positive duration such as 30s: %w", TimeoutEnv, v, vmfork.ErrInvalid)
		}
		opts.CallTimeout = d
	}
	return Connect(uri, log, opts)
}

// Connect is New with explicit options. The connection has libvirt's
// keepalive on, so that a call to a daemon that stopped answering fails
// after opts.CallTimeout with the connection closed instead of hanging the
// command; libvirt runs keepalive from its event loop, which this process
// runs in a goroutine of its own (eventLoop).
func Connect(uri string, log *logrus.Entry, opts Options) (*Driver, error) {
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = logrus.NewEntry(l)
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if err := eventLoop(log); err != nil {
		return nil, fmt.Errorf("connect to libvirt at %s: start the event loop: %w", uri, wrap(err))
	}
	// virConnectOpen has no timeout of its own: a daemon that accepts and
	// never answers (stopped, or hung) holds it forever. A connection that
	// opens after the bound is left to the exiting process.
	ctx, cancel := context.WithTimeout(context.Background(), opts.CallTimeout)
	defer cancel()
	var conn *libvirt.Connect
	err := bounded(ctx, "virConnectOpen", func() (err error) {
		conn, err = libvirt.NewConnect(uri)
		return wrap(err)
	})
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("virConnectOpen: no answer from libvirt within %v", opts.CallTimeout)
		} else if why := sessionStartProblem(uri); why != "" {
			err = fmt.Errorf("%w (%s)", err, why)
		}
		return nil, fmt.Errorf("connect to libvirt at %s: %w", uri, err)
	}
	interval := max(1, int(opts.CallTimeout/time.Second)/(keepaliveCount+1))
	// SetKeepAlive asks the daemon whether it speaks keepalive: a call too.
	// A driver in this process (test:///default) has no daemon to hang,
	// and no keepalive.
	if err := bounded(ctx, "virConnectSetKeepAlive", func() error {
		return wrap(conn.SetKeepAlive(interval, keepaliveCount))
	}); err != nil && !errors.Is(err, libvirt.ERR_NO_SUPPORT) {
		if ctx.Err() != nil {
			err = fmt.Errorf("virConnectSetKeepAlive: no answer from libvirt within %v", opts.CallTimeout)
		}
		return nil, fmt.Errorf("connect to libvirt at %s: %w", uri, err)
	}
	d := &Driver{
		uri: uri, conn: conn, log: log.WithField("driver", Name), QEMUConf: DefaultQEMUConf,
		StopGrace: 10 * time.Second, AgentTimeout: 30 * time.Second, BootTimeout: 5 * time.Minute,
		callTimeout: opts.CallTimeout,
	}
	if err := conn.RegisterCloseCallback(d.closed); err != nil {
		d.log.WithError(err).Debug("no close callback")
	}
	return d, nil
}

var (
	eventLoopOnce sync.Once
	eventLoopErr  error
)

// eventLoop registers libvirt's default event loop, once per process and
// before the first connection (libvirt's rule), and runs it for good.
func eventLoop(log *logrus.Entry) error {
	eventLoopOnce.Do(func() {
		if eventLoopErr = libvirt.EventRegisterDefaultImpl(); eventLoopErr != nil {
			return
		}
		go func() {
			for {
				if err := libvirt.EventRunDefaultImpl(); err != nil {
					log.WithError(err).Debug("libvirt event loop")
					time.Sleep(100 * time.Millisecond) // no busy loop on a persistent error
				}
			}
		}()
	})
	return eventLoopErr
}

// closed is libvirt's close callback. A connection closed for want of
// keepalive answers fails every call still waiting on it and every later
// one; from then on libvirt errors say why (virError).
func (d *Driver) closed(_ *libvirt.Connect, reason libvirt.ConnectCloseReason) {
	if reason != libvirt.CONNECT_CLOSE_REASON_KEEPALIVE {
		return
	}
	note := fmt.Sprintf("libvirt at %s did not answer for %v, connection closed", d.uri, d.callTimeout)
	hung.Store(&note)
	d.log.Debug(note)
}

// hung is the note of a connection of this process that libvirt closed
// because the daemon stopped answering; nil while none was.
var hung atomic.Pointer[string]

// named wraps err, from libvirt call name, so that the command's one-line
// error names the call; nil stays nil.
func named(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", name, wrap(err))
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
	if err := vmfork.PrepareDisks(ctx, m); err != nil {
		return err
	}
	def := BootXML(m, d.metadata(m, nil), BootOptions{User: user(d.uri)})
	undoFilter, err := d.withContractFilter(ctx, m, def)
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
	if err := m.PrepareLedgerSocket(); err != nil {
		return err
	}
	dom, err := d.conn.DomainCreateXML(x, 0)
	if err != nil {
		return fmt.Errorf("create domain %q: %w", m.Name, named("virDomainCreateXML", err))
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
		accel, err := profile.ChooseAccel(d.log.WithField("machine", m.Name))
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
		return "", fmt.Errorf("domain capabilities: %w", named("virConnectGetDomainCapabilities", err))
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
		md.TemplateRAM, md.URI = t.Paths.RAM, reapURI(d.uri)
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
		return fmt.Errorf("look up domain %q: %w", m.Name, named("virDomainLookupByName", err))
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
		return nil, fmt.Errorf("look up domain %q: %w", m.Name, named("virDomainLookupByName", err))
	}
	own, err := d.owner(dom, m)
	if err != nil || !own {
		dom.Free()
		if err != nil {
			return nil, fmt.Errorf("domain %q: %w", m.Name, err)
		}
		return nil, nil
	}
	return dom, nil
}

// owns reports whether dom carries m's mark in its metadata or, for an
// adopted machine (which carries no mark: vmfork changes nothing of it), is
// the domain that was adopted.
func (d *Driver) owns(dom *libvirt.Domain, m *vmfork.Machine) bool {
	own, _ := d.owner(dom, m)
	return own
}

// owner is owns with libvirt's failures: a daemon that does not answer is
// not a domain without vmfork's mark (that would make m look stopped).
func (d *Driver) owner(dom *libvirt.Domain, m *vmfork.Machine) (bool, error) {
	if m.Adopted != nil {
		uuid, err := dom.GetUUIDString()
		if err != nil {
			return false, named("virDomainGetUUIDString", err)
		}
		return uuid == m.Adopted.ID, nil
	}
	x, err := dom.GetMetadata(libvirt.DOMAIN_METADATA_ELEMENT, MetadataNS, libvirt.DOMAIN_AFFECT_LIVE)
	if errors.Is(err, libvirt.ERR_NO_DOMAIN_METADATA) || errors.Is(err, libvirt.ERR_NO_DOMAIN) {
		return false, nil
	}
	if err != nil {
		return false, named("virDomainGetMetadata", err)
	}
	md := parseMetadata(x)
	return md != nil && md.Machine == m.Name && filepath.Clean(md.MachineDir) == filepath.Clean(m.Paths.Dir), nil
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
		return "", fmt.Errorf("domain %q state: %w", m.Name, named("virDomainGetState", err))
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
	d.removeFilter(m)
	if m.Paths.Disk != "" {
		overlay.RemoveOldTops(m.Paths.Dir, m.Paths.Disk)
	}
	vmfork.RemoveOldDiskTops(m)
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
