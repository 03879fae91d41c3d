package vmfork

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/internal/proc"
	"github.com/vmfork/vmfork/overlay"
)

// journalEntry records an operation in flight (a boot, a fork, a template
// save, an rm), so that a CLI killed in the middle leaves evidence the next
// run acts on: a source to resume, machines to remove that never finished
// starting, a removal to finish.
type journalEntry struct {
	Op       journalOp `json:"op"`
	Source   string    `json:"source,omitempty"`
	Template string    `json:"template,omitempty"`
	Machines []string  `json:"machines,omitempty"` // created (or, for rm, removed) by the operation
	PID      int       `json:"pid"`                // the vmfork process doing it
	Started  time.Time `json:"started"`
	// Prior is the record to put back when the operation is undone: a
	// rewind's machine, stopped on its disk from before (checkpoint.go).
	Prior *Machine `json:"prior,omitempty"`
	// Thaw: the operation froze (or was about to freeze) the source's
	// guest filesystems through its agent (fork --disk-only, diskonly.go);
	// the repair thaws them.
	Thaw bool `json:"thaw,omitempty"`
}

// journalOp is what an entry's command was doing. Each has its repair in
// its verb's file (repairOf).
type journalOp string

const (
	opBoot      journalOp = "boot"      // boot.go: repairBoot
	opFork      journalOp = "fork"      // fork and template save, fork.go: repairFork
	opRm        journalOp = "rm"        // remove.go: repairRm
	opPool      journalOp = "pool"      // a warm pool's fill, pool.go: repairPoolFill
	opHibernate journalOp = "hibernate" // hibernate.go: repairHibernate
	opResume    journalOp = "resume"    // resume.go: repairResume
	opRewind    journalOp = "rewind"    // checkpoint.go: repairRewind
	opStart     journalOp = "start"     // start.go: repairStart
)

// repairOf returns the repair of op's entries; an op this vmfork does not
// know (a newer one's) gets nil, and its entry is left for that vmfork.
func (mg *Manager) repairOf(op journalOp) func(context.Context, journalEntry) (bool, error) {
	switch op {
	case opBoot:
		return mg.repairBoot
	case opFork:
		return mg.repairFork
	case opRm:
		return mg.repairRm
	case opPool:
		return mg.repairPoolFill
	case opHibernate:
		return mg.repairHibernate
	case opResume:
		return mg.repairResume
	case opRewind:
		return mg.repairRewind
	case opStart:
		return mg.repairStart
	}
	return nil
}

var journalSeq atomic.Uint64

// journal writes e and returns a func that removes it. The entry appears
// whole or not at all (writeJSON renames it into place), so a reader never
// mistakes a half-written entry of a live command for a torn one.
func (s *Store) journal(e journalEntry) (done func(), err error) {
	e.PID, e.Started = os.Getpid(), time.Now().UTC()
	name := fmt.Sprintf("%s-%d-%d-%d.json", e.Op, e.PID, e.Started.UnixNano(), journalSeq.Add(1))
	path := filepath.Join(s.StateDir, dirJournal, name)
	if err := writeJSON(path, e); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return func() { os.Remove(path) }, nil
}

// abandoned returns journal entries whose vmfork process is gone.
func (s *Store) abandoned() (map[string]journalEntry, error) {
	dir := filepath.Join(s.StateDir, dirJournal)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	out := map[string]journalEntry{}
	for _, de := range entries {
		path := filepath.Join(dir, de.Name())
		if strings.HasPrefix(de.Name(), ".") {
			// writeJSON's temporary file: a live writer renames it within
			// milliseconds, a killed one never does.
			if fi, err := de.Info(); err == nil && time.Since(fi.ModTime()) > time.Minute {
				os.Remove(path)
			}
			continue
		}
		var e journalEntry
		if err := readJSON(path, &e); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				os.Remove(path) // unreadable: nothing to act on
			}
			continue
		}
		if !vmforkAlive(e.PID) {
			out[path] = e
		}
	}
	return out, nil
}

// inFlightTemplates returns the templates that journal entries of live
// vmfork processes name: a fork or a template save in progress. Such a
// template's record can exist before anything protects it otherwise (a
// save's has no children and gets its name only after the freeze), and a
// concurrent command's collectTemplates must not take it.
func (s *Store) inFlightTemplates() map[string]bool {
	out := map[string]bool{}
	dir := filepath.Join(s.StateDir, dirJournal)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return out
	}
	for _, de := range entries {
		if strings.HasPrefix(de.Name(), ".") {
			continue
		}
		var e journalEntry
		if readJSON(filepath.Join(dir, de.Name()), &e) == nil && e.Template != "" && vmforkAlive(e.PID) {
			out[e.Template] = true
		}
	}
	return out
}

// claim takes abandoned entry path for this process by renaming it, so that
// two commands never repair the same entry at once. The entry keeps its
// dead PID: if this process dies too, the next command claims it again.
func claim(path string) (string, bool) {
	claimed := strings.TrimSuffix(path, ".json") + ".r" + strconv.Itoa(os.Getpid()) + ".json"
	if err := os.Rename(path, claimed); err != nil {
		return "", false
	}
	return claimed, true
}

// vmforkAlive reports whether pid is a live process running this binary.
func vmforkAlive(pid int) bool {
	if pid == os.Getpid() {
		return true
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	self, serr := os.Executable()
	if err != nil || serr != nil {
		return false
	}
	// A zombie's exe link is gone already; Running also says so for one
	// whose link a kernel still shows.
	return bytes.Equal([]byte(exe), []byte(self)) && proc.Running(pid)
}

// recoverLockWait bounds how long the repair waits for a name's lock: a
// name held that long belongs to a live command, and its entry waits for a
// later repair.
const recoverLockWait = 200 * time.Millisecond

// Recover repairs what interrupted commands left behind, and is how vmfork
// stays crash-safe (docs/RELIABILITY.md). For each journal entry of a dead
// vmfork process it resumes a source left paused, removes every machine the
// command created that had not finished (state creating: a fork child whose
// identity chain did not finish, a boot whose agent never answered),
// finishes an interrupted rm, gives up a kept template whose save did not
// finish, and removes the temporary files of the dead command. Half-made
// children are removed rather than finished: the identity options of the
// dead command (spec file, hooks, the caller's edits) are not on disk, and
// a chain cut short midway may not be safe to run twice. Every command that
// changes or lists machines calls it first; with nothing to repair it costs
// one directory read.
func (mg *Manager) Recover(ctx context.Context) error {
	// Branches of an explore that died go too (explore.go).
	mg.reapDeadExplores(ctx)
	entries, err := mg.Store.abandoned()
	if err != nil || len(entries) == 0 {
		return err
	}
	var errs []error
	for path, e := range entries {
		repair := mg.repairOf(e.Op)
		if repair == nil {
			mg.Log.WithField("op", e.Op).Warn("a journal entry of an operation this vmfork does not know is left as it is")
			continue
		}
		claimed, ok := claim(path)
		if !ok {
			continue // another command is repairing it
		}
		done, err := repair(ctx, e)
		if err != nil {
			errs = append(errs, err)
		}
		if !done {
			os.Rename(claimed, path) // for a later repair
			continue
		}
		os.Remove(claimed)
	}
	mg.collectTemplates(ctx)
	return errors.Join(errs...)
}

// repairMachines removes (or, for an rm, finishes removing) every machine
// entry e names (repairMachine); done is false when one must be tried
// again later.
func (mg *Manager) repairMachines(ctx context.Context, e journalEntry) (done bool, err error) {
	var errs []error
	for _, name := range e.Machines {
		if err := mg.repairMachine(ctx, e, name); err != nil {
			errs = append(errs, err)
		}
	}
	return len(errs) == 0, errors.Join(errs...)
}

// repairSourceDisk makes src's record name the top images its QEMU writes
// after a freeze into tpl that was cut short, its boot disk's and its extra
// disks'. The freeze prepares each disk's next top (an overlay on tpl's
// frozen image) before the pause and switches the source to it inside the
// pause; the record learns of it only after the freeze returns. Without
// this the template's frozen images, which the record does not know to be
// under the source, would be collected from under the source.
func (mg *Manager) repairSourceDisk(ctx context.Context, src *Machine, tpl *Template) error {
	record := func(top string) error {
		if err := mg.Store.SaveMachine(src); err != nil {
			return err
		}
		mg.Log.WithFields(logrus.Fields{"machine": src.Name, "disk": top}).Warn("recorded the disk an interrupted fork had switched the machine to")
		return nil
	}
	active := mg.activeLayers(ctx, src)
	if src.Spec.Disk != "" && tpl.Paths.Disk != "" && !tpl.ForeignDisk {
		writes := heldBy
		if active != nil {
			writes = isActive(active.Disk)
		}
		top, err := switchedTop(filepath.Join(filepath.Dir(src.Paths.Disk), "disk*.qcow2"), src.Paths.Disk, tpl.Paths.Disk, writes)
		if err != nil {
			return err
		}
		if top != "" {
			src.Paths.Disk = top
			if err := record(top); err != nil {
				return err
			}
		}
	}
	for _, td := range tpl.Disks {
		cur, ok := src.Paths.Disks[td.ID]
		if !td.Frozen() || !ok {
			continue
		}
		writes := heldBy
		if active != nil {
			writes = isActive(active.Disks[td.ID])
		}
		top, err := switchedTop(filepath.Join(src.Paths.Dir, "xdisk-"+td.ID+".*qcow2"), cur.File, td.File, writes)
		if err != nil {
			return err
		}
		if top != "" {
			src.Paths.Disks[td.ID] = DiskFile{File: top}
			if err := record(top); err != nil {
				return err
			}
		}
	}
	return nil
}

// activeLayers asks src's QEMU which image each disk writes, when the
// driver can say (ActiveLayerReporter) and the QEMU runs; nil otherwise,
// and the repair asks the image locks (heldBy). With no QEMU nothing
// holds or writes any prepared top: all of them go and the record keeps
// the tops it names (what a guest wrote to a switched top before its QEMU
// died goes with it; the disk is as it was at the pause).
func (mg *Manager) activeLayers(ctx context.Context, src *Machine) *ActiveLayers {
	r, ok := mg.Driver.(ActiveLayerReporter)
	if !ok {
		return nil
	}
	if st, _ := mg.Driver.Status(ctx, src); st == StateStopped {
		return nil
	}
	a, err := r.ActiveLayers(ctx, src)
	if err != nil {
		// Better than leaving the source paused: the locks are right but
		// in the moment between the freeze's link and its switch.
		mg.Log.WithField("machine", src.Name).WithError(err).Warn("could not ask QEMU which disk images it writes: repairing by the image locks")
		return nil
	}
	return &a
}

// heldBy reports whether a process holds top open (QEMU's image lock).
func heldBy(top string) (bool, error) { return overlay.InUse(top) }

// isActive returns a test of whether top is active, the image QEMU
// reports a disk writes ("" when QEMU has no such disk).
func isActive(active string) func(string) (bool, error) {
	return func(top string) (bool, error) {
		return active != "" && overlay.SameFile(active, top), nil
	}
}

// switchedTop returns which of the images matching pattern, other than
// cur (the top the record names), an interrupted freeze switched a disk
// to: an overlay directly on frozen that writes says is written (the
// active layer QEMU reports, or, where it cannot be asked, an image a
// process holds open); "" when none is. Every other such overlay was
// never switched to, or its QEMU is gone: the switch happens inside the
// pause, so the guest wrote nothing to it, and it is removed (a QEMU that
// opened it ahead of the switch keeps its open file until it exits).
func switchedTop(pattern, cur, frozen string, writes func(top string) (bool, error)) (string, error) {
	tops, _ := filepath.Glob(pattern)
	switched := ""
	for _, top := range tops {
		if top == cur {
			continue
		}
		chain, k, err := overlay.FindLayer(top, frozen)
		if err != nil || k != 1 || len(chain) < 2 {
			continue // not an overlay made on this frozen image
		}
		w, err := writes(top)
		if err != nil {
			return "", err
		}
		if !w {
			os.Remove(top)
			continue
		}
		switched = top
	}
	return switched, nil
}

// repairMachine removes machine name if entry e's command made it and did
// not finish it, or finishes its removal when e is an rm.
func (mg *Manager) repairMachine(ctx context.Context, e journalEntry, name string) error {
	unlock, err := mg.tryLock(ctx, name)
	if err != nil {
		return fmt.Errorf("repair %q after an interrupted %s: %w", name, e.Op, err)
	}
	defer unlock()
	m, err := mg.Store.LoadMachine(name)
	if errors.Is(err, ErrNotFound) {
		if e.Op == opRm {
			return mg.Store.RemoveMachine(name) // what a killed rm left in the trash
		}
		return nil
	}
	if err != nil || m.Driver != mg.Driver.Name() || m.Adopted != nil {
		return nil // not vmfork's to kill (adopt.go)
	}
	switch e.Op {
	case opRm:
		if m.Created.After(e.Started) {
			return nil // a new machine of that name
		}
	case opFork:
		if m.State != StateCreating || m.Template != e.Template {
			return nil // finished, or another fork's
		}
	default:
		if m.State != StateCreating {
			return nil
		}
	}
	if err := mg.stopAll(ctx, m); err != nil {
		return fmt.Errorf("remove %q left by an interrupted %s: %w", name, e.Op, err)
	}
	if err := mg.Store.RemoveMachine(name); err != nil {
		return fmt.Errorf("remove %q left by an interrupted %s: %w", name, e.Op, err)
	}
	mg.Log.WithField("machine", name).Warn("removed a machine an interrupted command left half-made")
	return nil
}

func (mg *Manager) tryLock(ctx context.Context, name string) (func(), error) {
	lctx, cancel := context.WithTimeout(ctx, recoverLockWait)
	defer cancel()
	return mg.Store.Lock(lctx, name)
}

// stopAll kills every process of m: the one its record names and any QEMU
// whose command line names m's QMP socket. A QEMU exists a moment before
// its PID can be recorded; its record, made before it was started, names
// the socket, so a command killed in that moment leaves no process unknown.
func (mg *Manager) stopAll(ctx context.Context, m *Machine) error {
	pids := qemuNaming(m.Paths.QMP)
	if len(pids) == 0 || (m.PID > 0 && !slices.Contains(pids, m.PID)) {
		pids = append(pids, m.PID) // the driver's own way (a libvirt domain)
	}
	var errs []error
	for _, pid := range pids {
		c := *m
		c.PID = pid
		if err := mg.Driver.Stop(context.WithoutCancel(ctx), &c, true); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// qemuNaming returns the live QEMU processes whose command line contains
// marker, a path that only one machine's QEMU is given.
func qemuNaming(marker string) []int {
	if marker == "" {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, de := range entries {
		pid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + de.Name() + "/cmdline")
		if err != nil {
			continue
		}
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		if bytes.Contains(argv0, []byte("qemu")) && bytes.Contains(cmdline, []byte(marker)) && proc.Running(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}
