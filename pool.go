package vmfork

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/customize"
	"github.com/vmfork/vmfork/overlay"
)

// A warm pool takes QEMU's start off a child's critical path. A kept
// template (kept.go) can keep PoolSize processes started ahead with its
// exact device configuration and -incoming defer, RAM mapped share=off from
// the template, a fresh vmgenid each, x-ignore-shared set and a disk overlay
// on the frozen disk already made. A fork from the template takes members
// first: it only loads the device state and lets the child run.
//
// Members live in <state-dir>/pool/<template-id>/<k>/, with their record in
// member.json. A child made from member k keeps that directory as its own
// (Machine.Paths.Dir): QEMU knows its files by those names and reopens the
// disk by name when the disk later becomes a backing image, so they can
// never move. Taking a member writes the child's record first and removes
// member.json second; all of it happens under the template's lock.
//
// Only kept templates have pools: a live fork's RAM file does not exist
// before the source is paused, so nothing can be started ahead for it.

// MaxPoolSize bounds a kept template's pool: each member holds tens of MiB.
const MaxPoolSize = 64

func (s *Store) poolRoot() string { return filepath.Join(s.StateDir, dirPool) }

// inPool reports whether dir is a pool member's directory.
func (s *Store) inPool(dir string) bool {
	rel, err := filepath.Rel(s.poolRoot(), dir)
	return err == nil && rel != "." && !strings.HasPrefix(rel, "..")
}

// newPoolMember reserves the next free member directory of kept template t
// and returns the member's record, not yet saved.
func (s *Store) newPoolMember(t *Template) (*Machine, error) {
	dir := filepath.Join(s.poolRoot(), t.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pool of %q: %w", t.Name, err)
	}
	for k := 1; ; k++ {
		d := filepath.Join(dir, strconv.Itoa(k))
		err := os.Mkdir(d, 0o700)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pool of %q: %w", t.Name, err)
		}
		m := &Machine{
			Name: fmt.Sprintf("%s-pool-%d", t.Name, k), Driver: t.Driver, State: StatePooled,
			Accel: t.Accel, Spec: t.Spec, Parent: t.Source, Template: t.ID, Created: time.Now().UTC(),
			VMGenID: newUUID(),
			Paths: Paths{
				Dir: d, Disk: filepath.Join(d, fileDisk), QMP: filepath.Join(d, fileQMP),
				QGA: filepath.Join(d, fileQGA), Serial: filepath.Join(d, fileSerial),
				Ledger: filepath.Join(d, fileLedger),
				Log:    filepath.Join(d, fileQEMULog), RAM: t.MappedRAM(), RAMShared: false,
			},
		}
		if t.Paths.Disk == "" {
			m.Paths.Disk = ""
		}
		// Host ports are backends: each member picks free ones of its own.
		m.Spec.Ports = make([]PortForward, len(t.Spec.Ports))
		for i, p := range t.Spec.Ports {
			m.Spec.Ports[i] = PortForward{Guest: p.Guest}
		}
		return m, nil
	}
}

func (s *Store) savePoolMember(m *Machine) error {
	if err := writeJSON(filepath.Join(m.Paths.Dir, fileMember), m); err != nil {
		return fmt.Errorf("pool member %q: save record: %w", m.Name, err)
	}
	return nil
}

// listPool returns kept template id's members, oldest first. A directory
// without member.json is a child's (or a member being made) and is skipped.
func (s *Store) listPool(id string) ([]*Machine, error) {
	dir := filepath.Join(s.poolRoot(), id)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pool of template %q: %w", id, err)
	}
	var ms []*Machine
	for _, e := range entries {
		var m Machine
		if readJSON(filepath.Join(dir, e.Name(), fileMember), &m) == nil {
			ms = append(ms, &m)
		}
	}
	return ms, nil
}

// fillPool brings kept template t's pool to t.PoolSize live members: it
// removes dead and extra members and starts new ones. The caller holds the
// template's lock.
func (mg *Manager) fillPool(ctx context.Context, t *Template) error {
	pooler, ok := mg.Driver.(Pooler)
	if !ok && t.PoolSize > 0 {
		return fmt.Errorf("template %q: driver %q has no warm pool: %w", t.Name, mg.Driver.Name(), ErrUnsupported)
	}
	// A fill cut short leaves members being started: the next command
	// removes them (repairPool), not only the next fill of this pool.
	done, err := mg.Store.journal(journalEntry{Op: opPool, Template: t.ID})
	if err != nil {
		return fmt.Errorf("template %q: %w", t.Name, err)
	}
	defer done()
	members, err := mg.Store.listPool(t.ID)
	if err != nil {
		return err
	}
	mg.sweepPool(t.ID)
	live := 0
	for _, m := range members {
		st, _ := mg.Driver.Status(ctx, m)
		// A member still creating was being started by a command that
		// died: the caller holds the lock every pool change takes.
		if st == StateStopped || m.State == StateCreating || live >= t.PoolSize {
			mg.removePoolMember(ctx, m)
			continue
		}
		live++
	}
	// A refill after a fork is admitted as a fork is: on a host without
	// room the pool stays short, and the forks of it start cold.
	if live < t.PoolSize {
		if _, err := mg.admit(mg.poolDemand(t, t.PoolSize-live)); err != nil {
			return fmt.Errorf("template %q: fill the warm pool: %w", t.Name, err)
		}
	}
	var errs []error
	for ; live < t.PoolSize; live++ {
		if err := mg.startPoolMember(ctx, pooler, t); err != nil {
			errs = append(errs, err)
			break // the next attempt would fail the same way
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("template %q: fill the warm pool: %w", t.Name, errors.Join(errs...))
	}
	return nil
}

func (mg *Manager) startPoolMember(ctx context.Context, pooler Pooler, t *Template) error {
	m, err := mg.Store.newPoolMember(t)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		os.RemoveAll(m.Paths.Dir)
		return err
	}
	// The member's NIC is configured with a MAC of its own, which becomes
	// its child's (claimMember): the guest wakes with the template's MAC,
	// but after a reset it takes the configured one, and that must not be
	// the template's, a sibling's or any machine's in the store.
	m.GuestMAC = customize.ChildMAC([]byte(m.VMGenID), 1, append(mg.inheritedMACs(m, t), mg.machineMACs(m.Name)...)...)
	// The record exists before the process does, naming its QMP socket, so
	// a command killed right after the spawn leaves no QEMU unknown: the
	// next fill finds it by that socket (stopAll) and removes it.
	m.State = StateCreating
	if err := mg.Store.savePoolMember(m); err != nil {
		return fail(err)
	}
	if m.Paths.Disk != "" {
		if err := overlay.Create(ctx, t.Paths.Disk, m.Paths.Disk); err != nil {
			return fail(err)
		}
	}
	// Its extra disks too, as a child's (QEMU opens them at its start):
	// the child that claims it takes them with the rest of its files.
	if err := childDisks(ctx, t, m); err != nil {
		return fail(err)
	}
	if err := pooler.Prestart(ctx, m, t); err != nil {
		return fail(err)
	}
	m.State = StatePooled
	if err := mg.Store.savePoolMember(m); err != nil {
		mg.Driver.Stop(context.WithoutCancel(ctx), m, true)
		return fail(err)
	}
	Fault(FaultPoolFilled, m.PID)
	mg.Log.WithFields(logrus.Fields{"template": t.ID, "member": m.Name, "pid": m.PID}).Debug("pool member started")
	return nil
}

func (mg *Manager) removePoolMember(ctx context.Context, m *Machine) {
	log := mg.Log.WithFields(logrus.Fields{"template": m.Template, "member": m.Name})
	if err := mg.stopAll(ctx, m); err != nil {
		log.WithError(err).Warn("could not stop a pool member")
		return
	}
	if err := os.RemoveAll(m.Paths.Dir); err != nil {
		log.WithError(err).Warn("could not remove a pool member's files")
	}
}

// takePool takes up to n live members of kept template t for a fork's
// children. The caller holds the template's lock and hands every member it
// got to a child (startChild), which owns its files from then on.
func (mg *Manager) takePool(ctx context.Context, t *Template, n int) []*Machine {
	if _, ok := mg.Driver.(Pooler); !ok || n == 0 {
		return nil
	}
	members, err := mg.Store.listPool(t.ID)
	if err != nil {
		mg.Log.WithError(err).Warn("warm pool unreadable; starting children cold")
		return nil
	}
	var got []*Machine
	for _, m := range members {
		if len(got) == n {
			break
		}
		if st, _ := mg.Driver.Status(ctx, m); st == StateStopped || m.State == StateCreating {
			mg.removePoolMember(ctx, m)
			continue
		}
		got = append(got, m)
	}
	return got
}

// claimMember makes child c the owner of pool member m ("claim", not
// "adopt": adopting is taking on a foreign libvirt domain, adopt.go): c
// takes m's process, files (its extra disks' images among them), ports,
// vmgenid and MAC. c's record is saved
// before m's is removed, so a crash in between leaves the process to the
// journal's repair of c.
func (mg *Manager) claimMember(c, m *Machine) error {
	c.PID, c.VMGenID, c.Paths, c.Spec.Ports = m.PID, m.VMGenID, m.Paths, m.Spec.Ports
	if m.GuestMAC != "" {
		// The MAC the member's NIC is configured with (startPoolMember).
		c.GuestMAC = m.GuestMAC
	}
	if err := mg.Store.SaveMachine(c); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(m.Paths.Dir, fileMember)); err != nil {
		return fmt.Errorf("take pool member %q: %w", m.Name, err)
	}
	return nil
}

// removePool stops every member of template id's pool and removes the pool
// directory when nothing else is left in it.
func (mg *Manager) removePool(ctx context.Context, id string) {
	members, _ := mg.Store.listPool(id)
	for _, m := range members {
		mg.removePoolMember(ctx, m)
	}
	os.Remove(filepath.Join(mg.Store.poolRoot(), id)) // fails while children live there
}

// sweepPool removes member directories of template id that hold neither a
// member record nor the files of a child made from a member: what a command
// killed between making the directory and recording the member left. The
// caller holds the template's lock, so no member is being made.
func (mg *Manager) sweepPool(id string) {
	dir := filepath.Join(mg.Store.poolRoot(), id)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	used := map[string]bool{}
	ms, err := mg.Store.ListMachines()
	if err != nil {
		return
	}
	for _, m := range ms {
		used[filepath.Clean(m.Paths.Dir)] = true
	}
	for _, e := range entries {
		d := filepath.Join(dir, e.Name())
		if _, err := os.Stat(filepath.Join(d, fileMember)); err == nil || used[d] {
			continue
		}
		// A child's record is made before the member's is removed
		// (claimMember): no record either way means no one owns it.
		if qemuNaming(filepath.Join(d, fileQMP)) != nil {
			continue // a process still runs there; never pull files from under it
		}
		os.RemoveAll(d)
	}
}

// repairPoolFill repairs a fill of a kept template's warm pool whose vmfork
// process died (journal.go), under the template name's lock.
func (mg *Manager) repairPoolFill(ctx context.Context, e journalEntry) (done bool, err error) {
	t, err := mg.Store.LoadTemplate(e.Template)
	if err != nil {
		// Gone since, its pool with it; or never recorded.
		mg.Store.RemoveTemplate(e.Template)
		mg.Store.removeTempFiles(e.Template)
		return true, nil
	}
	if t.Name != "" {
		unlock, err := mg.tryLock(ctx, t.Name)
		if err != nil {
			return false, nil
		}
		defer unlock()
	}
	mg.repairPool(ctx, t)
	mg.Store.removeTempFiles(e.Template) // a killed member's start RAM file
	return true, nil
}

// repairPool removes what an interrupted fill of template t's pool left:
// members still being started and member directories nobody owns. The
// caller holds the template's lock.
func (mg *Manager) repairPool(ctx context.Context, t *Template) {
	members, _ := mg.Store.listPool(t.ID)
	for _, m := range members {
		if m.State == StateCreating {
			mg.removePoolMember(ctx, m)
			mg.Log.WithFields(logrus.Fields{"template": t.ID, "member": m.Name}).Warn("removed a pool member an interrupted command left half-made")
		}
	}
	mg.sweepPool(t.ID)
}

// poolDemand estimates n new warm-pool members of kept template t: each
// becomes a child of t's source, and is counted as one.
func (mg *Manager) poolDemand(t *Template, n int) demand {
	src := &Machine{Name: t.Source, Spec: t.Spec}
	return mg.childDemand(fmt.Sprintf("template pool %q", t.Name), "pool members", src, n, true)
}
