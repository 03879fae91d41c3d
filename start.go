package vmfork

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qmp"
)

// Start boots a stopped machine again, from its own disk, as the same
// machine: its name, guest MAC, host ports, network, vmgenid and contract
// are its record's, and no identity chain runs (virsh start, not a fork).
// A fork child mapped its template's RAM share=off; started, it gets a RAM
// file of its own in the mem dir (a cold boot needs none of the
// template's), so it starts after a host restart took the template's RAM,
// and it no longer keeps that template's memory in use.
//
// What a guest keeps on its disk it has again (a Debian guest's hostname
// and machine-id). A guest whose root file system is not on its disk (the
// busybox test guest's initramfs, a live image) boots with its image's
// hostname and a new machine-id; start puts back the ones its record holds
// (restoreIdentity), so that the machine is the one it was.
//
// Crash safety: the record says stopped until the new QEMU's agent has
// answered and the identity is back; that save is the commit point. A
// start killed before it (a journal entry opStart) is undone by the repair:
// any QEMU of the machine is killed and it stays stopped, as a start that
// fails leaves it. Start it again.

// FaultStartRunning: a started machine's QEMU runs and its agent answered;
// its record still says stopped (fault.go).
const FaultStartRunning = "start.running"

// StartResult is what a start did. Its JSON form is a contract with
// scripts: change it only by adding.
type StartResult struct {
	Name  string        `json:"name"`
	State State         `json:"state"`
	PID   int           `json:"pid"`
	MAC   string        `json:"mac,omitempty"`
	Ports []PortForward `json:"ports"`
	// Hostname is the one its record holds (a fork child's); Restored
	// names what start put back in a guest that had lost it (hostname,
	// machine-id).
	Hostname string   `json:"hostname,omitempty"`
	Restored []string `json:"restored,omitempty"`
	ReadyMS  float64  `json:"ready_ms"`
}

// startPlan is a start of one machine, checked once.
type startPlan struct {
	m *Machine
	// admission is what the start will take of the host (admission.go).
	admission *Admission
}

// planStart checks a start of machine name, taking its lock in l.
func (mg *Manager) planStart(ctx context.Context, name string, l *lockSet) (*startPlan, error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	if err := l.take(ctx, name); err != nil {
		return nil, fmt.Errorf("start %q: %w", name, err)
	}
	m, err := mg.Get(ctx, name)
	if errors.Is(err, ErrNotFound) {
		if t, kerr := mg.Store.FindKept(name); kerr == nil {
			return nil, fmt.Errorf("start %q: %q is a kept template, not a machine (vmfork fork %s makes machines of it): %w", name, t.Name, t.Name, ErrInvalid)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	switch {
	case m.Driver != mg.Driver.Name():
		return nil, fmt.Errorf("start %q: machine belongs to driver %q, not %q: %w", name, m.Driver, mg.Driver.Name(), ErrInvalid)
	case m.Adopted != nil:
		return nil, fmt.Errorf("start %q: an adopted machine is its owner's to start: %w", name, ErrUnsupported)
	case m.State == StateHibernated:
		return nil, fmt.Errorf("start %q: machine is hibernated (vmfork resume %s continues it): %w", name, name, ErrInvalid)
	case m.State == StateRunning || m.State == StatePaused:
		return nil, fmt.Errorf("start %q: machine is %s already: %w", name, m.State, ErrInvalid)
	case m.State != StateStopped:
		return nil, fmt.Errorf("start %q: machine is %s: %w", name, m.State, ErrInvalid)
	}
	if err := checkStartFiles(m); err != nil {
		return nil, fmt.Errorf("start %q: %w", name, err)
	}
	for _, p := range m.Spec.Ports {
		if p.Host == 0 {
			continue
		}
		if err := PickPorts([]PortForward{p}); err != nil {
			return nil, fmt.Errorf("start %q: its port forward %s: %w", name, p, err)
		}
	}
	if nc, ok := mg.Driver.(NetworkChecker); ok {
		if err := nc.CheckNetwork(ctx, m); err != nil {
			return nil, fmt.Errorf("start %q: %w", name, err)
		}
	}
	// Last, as a fork's plan: the host must have room for its RAM.
	a, err := mg.admit(mg.startDemand(m))
	if err != nil {
		return nil, err
	}
	return &startPlan{m: m, admission: a}, nil
}

// checkStartFiles checks that what m boots from is there: its kernel and
// initrd, and its own disk with every layer below it. A missing overlay
// would otherwise be made again, empty, on the base image: the machine
// would boot, without its data.
func checkStartFiles(m *Machine) error {
	for _, f := range []struct{ what, path string }{{"kernel", m.Spec.Kernel}, {"initrd", m.Spec.Initrd}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("its %s: %w", f.what, asInvalid(err))
		}
	}
	if m.Spec.Disk == "" {
		return nil
	}
	if _, err := os.Stat(m.Paths.Disk); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("its disk %s is gone; the machine cannot start (vmfork rm %s): %w", m.Paths.Disk, m.Name, ErrInvalid)
	}
	if _, err := overlay.Chain(m.Paths.Disk); err != nil {
		return fmt.Errorf("its disk chain: %w", err)
	}
	return nil
}

// Start boots stopped machine name again from its own disk and returns
// once its guest agent answers (bounded by ctx's deadline, or the driver's
// boot timeout). On error the machine stays stopped and the error says so.
func (mg *Manager) Start(ctx context.Context, name string) (res *StartResult, err error) {
	defer func() { err = mg.Store.explainFull(err, 0) }()
	mg.recoverFirst(ctx)
	l := mg.locks()
	defer l.release()
	p, err := mg.planStart(ctx, name, l)
	if err != nil {
		return nil, err
	}
	return mg.applyStart(ctx, p)
}

// PlanStart checks a start of names as Start does and says what it would
// do. Like start it checks every name: errs[i] is names[i]'s error, or nil.
func (mg *Manager) PlanStart(ctx context.Context, names []string) (*Plan, []error) {
	return planEach("start", names, func(name string) (*Plan, error) {
		return dryRun(mg.planStart(ctx, name, noLocks()))
	})
}

func (p *startPlan) render() *Plan {
	m := p.m
	out := &Plan{Command: "start", Changed: true, Machines: []string{m.Name}, Contract: m.Contract}
	from := "its kernel"
	if m.Spec.Disk != "" {
		from = "its own disk " + m.Paths.Disk
	}
	var ports []string
	for _, pf := range m.Spec.Ports {
		ports = append(ports, pf.String())
	}
	out.add("boot stopped machine %q again from %s, with its name, MAC %s, ports [%s] and network %s (no identity chain: the same machine)",
		m.Name, from, startMAC(m), strings.Join(ports, " "), m.Spec.Network.Effective())
	if !m.Paths.RAMShared {
		out.add("give it a RAM file of its own in the mem dir instead of template %s's", m.Template)
	}
	if id := m.Identity; id != nil && (id.Hostname != "" || id.MachineID != "") {
		out.add("put its hostname %q and machine-id back if the guest booted without them", id.Hostname)
	}
	if p.admission != nil {
		out.add("%s", p.admission.describe())
		out.Admission = p.admission
	}
	return out
}

// startMAC is the MAC m's guest has: a fork child's own, else its spec's.
func startMAC(m *Machine) string {
	if m.GuestMAC != "" {
		return m.GuestMAC
	}
	return m.Spec.MAC
}

// applyStart carries out plan p; the caller holds its lock.
func (mg *Manager) applyStart(ctx context.Context, p *startPlan) (*StartResult, error) {
	begin := time.Now()
	m, name := p.m, p.m.Name
	done, err := mg.Store.journal(journalEntry{Op: opStart, Source: name})
	if err != nil {
		return nil, fmt.Errorf("start %q: %w", name, err)
	}
	defer done()
	c := *m
	c.Spec.Ports = slices.Clone(m.Spec.Ports)
	c.PID = 0
	if !c.Paths.RAMShared {
		// A cold boot needs none of the template's RAM: the machine gets
		// its own file, as a booted machine has, and can be forked as one.
		c.Paths.RAM, c.Paths.RAMShared = mg.Store.MachinePaths(name).RAM, true
	}
	log := mg.Log.WithField("machine", name)
	log.Info("starting")
	stays := func(err error) (*StartResult, error) {
		mg.unbroker(context.WithoutCancel(ctx), &c)
		return nil, fmt.Errorf("start %q: %w (the machine stays stopped)", name, err)
	}
	// What a QEMU that died on its own left (its sockets, its RAM file,
	// its host rules) goes first; after a stop by vmfork this finds
	// nothing. Driver.Stop of a machine without a process only clears.
	if err := mg.Driver.Stop(ctx, &c, true); err != nil {
		return nil, fmt.Errorf("start %q: clear what its last QEMU left: %w (the machine stays stopped)", name, err)
	}
	brokered, err := mg.brokerSecrets(ctx, &c, 0)
	if err != nil {
		return stays(err)
	}
	if err := mg.Driver.Start(ctx, &c); err != nil {
		return stays(err)
	}
	brokered(ctx)
	Fault(FaultStartRunning, c.PID)
	restored, err := mg.restoreIdentity(ctx, &c)
	if err != nil {
		mg.Driver.Stop(context.WithoutCancel(ctx), &c, true)
		return stays(fmt.Errorf("put its identity back: %w", err))
	}
	c.State, c.StopReason = StateRunning, ""
	if err := mg.Store.SaveMachine(&c); err != nil {
		mg.Driver.Stop(context.WithoutCancel(ctx), &c, true)
		return stays(err)
	}
	mg.attachLedger(ctx, &c)
	log.WithFields(logrus.Fields{"pid": c.PID, "elapsed": time.Since(begin).Round(time.Millisecond)}).Info("started")
	res := &StartResult{Name: name, State: StateRunning, PID: c.PID, MAC: startMAC(&c), Ports: c.Spec.Ports,
		Restored: restored, ReadyMS: ms(time.Since(begin))}
	if res.Ports == nil {
		res.Ports = []PortForward{}
	}
	if c.Identity != nil {
		res.Hostname = c.Identity.Hostname
	}
	return res, nil
}

// restoreScript puts back the hostname ($1) and machine-id ($2) a guest
// booted without, and prints what it changed. An empty argument is left
// alone. It writes the kernel's hostname through /proc (what hostname(1)
// does) and /etc/hostname where the guest has one, and rewrites the files
// in place (qemu-ga's umask 077 would make new ones unreadable).
const restoreScript = `h=$1 id=$2 out=
if [ -n "$h" ] && [ "$(cat /proc/sys/kernel/hostname)" != "$h" ]; then
	echo "$h" >/proc/sys/kernel/hostname || exit 1
	[ -f /etc/hostname ] && echo "$h" >/etc/hostname
	out=hostname
fi
if [ -n "$id" ] && [ "$(cat /etc/machine-id 2>/dev/null)" != "$id" ]; then
	echo "$id" >/etc/machine-id || exit 1
	out="$out machine-id"
fi
echo $out`

// restoreIdentity puts back, in started machine m's guest, the hostname
// and machine-id its identity chain gave it, where the guest booted
// without them. A machine with none recorded (a booted one) is left as
// its guest booted.
func (mg *Manager) restoreIdentity(ctx context.Context, m *Machine) ([]string, error) {
	id := m.Identity
	if id == nil || (id.Hostname == "" && id.MachineID == "") {
		return nil, nil
	}
	a, err := mg.Driver.Agent(ctx, m)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	st, err := a.Run(ctx, qmp.ExecRequest{Path: "/bin/sh", Args: []string{"-c", restoreScript, "sh", id.Hostname, id.MachineID}, CaptureOutput: true})
	if err != nil {
		return nil, err
	}
	if st.ExitCode != 0 {
		return nil, fmt.Errorf("guest script exited %d: %s", st.ExitCode, strings.TrimSpace(string(st.Stderr)))
	}
	return strings.Fields(string(st.Stdout)), nil
}

// repairStart undoes a start whose vmfork process died before its record
// said running (journal.go): any QEMU of the machine is killed and it
// stays stopped. One that had committed is left running.
func (mg *Manager) repairStart(ctx context.Context, e journalEntry) (done bool, err error) {
	unlock, err := mg.tryLock(ctx, e.Source)
	if err != nil {
		return false, nil
	}
	defer unlock()
	m, err := mg.Store.LoadMachine(e.Source)
	if err != nil || m.Driver != mg.Driver.Name() || m.State != StateStopped {
		return true, nil // gone, another driver's, or committed
	}
	// The record is the one from before the start: its paths name what
	// the new QEMU was given, but a child's RAM file is its own now.
	c := *m
	if !c.Paths.RAMShared {
		c.Paths.RAM, c.Paths.RAMShared = mg.Store.MachinePaths(m.Name).RAM, true
	}
	if err := mg.stopAll(ctx, &c); err != nil {
		return false, fmt.Errorf("repair %q after an interrupted start: %w", m.Name, err)
	}
	mg.detachLedger(ctx, &c)
	mg.Log.WithField("machine", m.Name).Warn("a machine whose start was interrupted stays stopped")
	return true, nil
}
