package vmfork

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/sharedmem"
)

// Hibernate and resume are built on the fork primitive (DESIGN, "The one
// primitive"). Hibernate freezes a running machine into a template of its
// own, as a fork does, writes the template's RAM to a sparse file under the
// state dir, and ends the machine's QEMU: the RAM on the mem dir's tmpfs
// goes, and the host has the memory back. Resume is a fork in place, as a
// rewind is: a child of that template takes the machine's name, directory,
// host ports and guest MAC. Its identity is not made again (it is the same
// machine continuing); only its clock is stepped to the host's, since the
// guest's clock stood still while it slept and would lag by that long.
//
// A fork of a hibernated machine makes children of the same template and
// leaves the machine hibernated. Both it and resume first bring the RAM
// back to the mem dir ("thaw"): children map RAM share=off from there, and
// their own forks keep their RAM files next to it.
//
// Crash safety: Machine.Hibernated names the template before the freeze, so
// nothing collects it meanwhile, and the record's state turning to
// hibernated is the commit point. It is written as soon as the freeze has
// returned (the template then holds the whole instant, its RAM still in the
// mem dir) and before the QEMU is ended; the RAM goes to disk after. A kill
// -9 before the commit leaves the machine running (the journal's repair
// clears Hibernated, and the template is collected); after it, the repair
// ends the QEMU if it still runs, writes the RAM to disk if it is not there
// and frees the mem dir, leaving a complete hibernated machine. A resume cut
// short is put back to hibernated: the RAM file on disk is removed only
// once the resumed machine runs.

// fileHibernatedRAM is the RAM file of a hibernated machine's template, in
// the template's directory under the state dir.
const fileHibernatedRAM = "ram.hibernated"

// Fault points of hibernate and resume (fault.go).
const (
	// FaultHibernateFrozen: the machine is frozen into its template and
	// runs again; its record does not say hibernated yet.
	FaultHibernateFrozen = "hibernate.frozen"
	// FaultHibernateCommitted: the record says hibernated; the machine's
	// QEMU still runs and its RAM is in the mem dir only.
	FaultHibernateCommitted = "hibernate.committed"
	// FaultResumeRunning: the resumed machine's new QEMU runs; its clock
	// step has not run and its record is not final.
	FaultResumeRunning = "resume.running"
)

// HibernateResult is what a hibernate did. Its JSON form is a contract with
// scripts: change it only by adding.
type HibernateResult struct {
	Name     string  `json:"name"`
	State    State   `json:"state"`
	Template string  `json:"template"`
	PauseMS  float64 `json:"pause_ms"`
	// RAMFile is the sparse file under the state dir that holds the RAM;
	// RAMBytes is what it stores (its allocated extents), RAMSizeBytes its
	// length (the machine's RAM size).
	RAMFile      string  `json:"ram_file"`
	RAMBytes     int64   `json:"ram_bytes"`
	RAMSizeBytes int64   `json:"ram_size_bytes"`
	ElapsedMS    float64 `json:"elapsed_ms"`
}

// inPlacer returns the driver's Forker and InPlaceStarter for verb on
// machine name: hibernate needs them for the resume to come, which starts
// a new process from a record whose files stay where the machine's were.
func (mg *Manager) inPlacer(verb, name string) (Forker, InPlaceStarter, error) {
	forker, ok := mg.Driver.(Forker)
	starter, inPlace := mg.Driver.(InPlaceStarter)
	if !ok || !inPlace {
		return nil, nil, fmt.Errorf("%s %q: %s is not supported by the %s driver: %w", verb, name, verb, mg.Driver.Name(), ErrUnsupported)
	}
	if err := ValidateName(name); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", verb, err)
	}
	return forker, starter, nil
}

// hibernatePlan is a hibernate resolved and checked once.
type hibernatePlan struct {
	forker Forker
	m      *Machine
}

// planHibernate checks a hibernate of machine name, taking its lock in l.
func (mg *Manager) planHibernate(ctx context.Context, name string, l *lockSet) (*hibernatePlan, error) {
	forker, _, err := mg.inPlacer("hibernate", name)
	if err != nil {
		return nil, err
	}
	if err := l.take(ctx, name); err != nil {
		return nil, fmt.Errorf("hibernate %q: %w", name, err)
	}
	m, err := mg.Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("hibernate: %w", err)
	}
	switch {
	case m.Driver != mg.Driver.Name():
		return nil, fmt.Errorf("hibernate %q: machine belongs to driver %q: %w", m.Name, m.Driver, ErrInvalid)
	case m.Adopted != nil:
		return nil, fmt.Errorf("hibernate %q: an adopted machine's process is its owner's to end: %w", m.Name, ErrUnsupported)
	case m.State == StateHibernated:
		return nil, fmt.Errorf("hibernate %q: machine is hibernated already: %w", m.Name, ErrInvalid)
	case m.State != StateRunning:
		return nil, fmt.Errorf("hibernate %q: machine is %s: %w", m.Name, m.State, ErrNotRunning)
	}
	if err := mg.checkHibernateSpace(m); err != nil {
		return nil, fmt.Errorf("hibernate %q: %w", name, err)
	}
	return &hibernatePlan{forker: forker, m: m}, nil
}

// Hibernate freezes running machine name, writes its RAM to disk and ends
// its QEMU. Until the record says hibernated any failure leaves the machine
// running; the error says which.
func (mg *Manager) Hibernate(ctx context.Context, name string) (res *HibernateResult, err error) {
	defer func() { err = mg.Store.explainFull(err, 0) }()
	mg.recoverFirst(ctx)
	l := mg.locks()
	defer l.release()
	p, err := mg.planHibernate(ctx, name, l)
	if err != nil {
		return nil, err
	}
	return mg.applyHibernate(ctx, p)
}

// PlanHibernate checks a hibernate as Hibernate does and says what it would
// do.
func (mg *Manager) PlanHibernate(ctx context.Context, name string) (*Plan, error) {
	return dryRun(mg.planHibernate(ctx, name, noLocks()))
}

func (p *hibernatePlan) render() *Plan {
	m := p.m
	out := &Plan{Command: "hibernate", Changed: true, Source: m.Name, SourcePauses: true, Machines: []string{m.Name}}
	out.add("pause running machine %q for a fraction of a second and freeze it into a new template", m.Name)
	out.add("write its RAM (%d MiB) sparse under the state dir and end its QEMU (pid %d); the mem dir gets its RAM back", m.Spec.MemoryMiB, m.PID)
	return out
}

// applyHibernate carries out plan p; the caller holds its lock.
func (mg *Manager) applyHibernate(ctx context.Context, p *hibernatePlan) (*HibernateResult, error) {
	start := time.Now()
	m, name := p.m, p.m.Name
	t, done, err := mg.prepareHibernation(m)
	if err != nil {
		return nil, fmt.Errorf("hibernate %q: %w", name, err)
	}
	// Until the commit every failure leaves m running, and its template
	// goes as an unused one. The freeze leaves m paused: resumed here (a
	// no-op on a machine that runs).
	runsOn := func(err error) (*HibernateResult, error) {
		if rerr := p.forker.Resume(context.WithoutCancel(ctx), m); rerr != nil {
			err = errors.Join(err, fmt.Errorf("resume: %v: %w", rerr, ErrStillPaused))
		}
		m.State, m.Hibernated = StateRunning, ""
		if serr := mg.Store.SaveMachine(m); serr != nil {
			err = errors.Join(err, serr)
		}
		if !errors.Is(err, ErrStillPaused) {
			done() // a source still paused keeps its entry: the repair resumes it
		}
		mg.collectTemplates(ctx)
		return nil, fmt.Errorf("hibernate %q: %w (the machine runs on)", name, err)
	}
	if err := mg.freezeRunning(ctx, p.forker, m, t, FreezeOptions{LeavePaused: true}); err != nil {
		return runsOn(err)
	}
	Fault(FaultHibernateFrozen, m.PID)
	// The commit, as soon as the template holds the whole instant (its RAM
	// still in the mem dir). The guest stays paused from the freeze until
	// its QEMU is killed, so nothing it could do after the instant is lost.
	// The RAM goes to disk after the kill.
	m.State = StateHibernated
	if err := mg.Store.SaveMachine(m); err != nil {
		return runsOn(err)
	}
	Fault(FaultHibernateCommitted, m.PID)
	stored, err := mg.endHibernated(ctx, m, t)
	mg.detachLedger(ctx, m) // its QEMU is gone (or going: the repair ends it)
	if err != nil {
		// The entry stays: the next command finishes (journal.go).
		return nil, fmt.Errorf("hibernate %q: %w", name, err)
	}
	done()
	mg.collectTemplates(ctx) // the template m was a child of may be unused now
	mg.Log.WithFields(logrus.Fields{"machine": name, "template": t.ID, "ram_bytes": stored}).Info("machine hibernated")
	return &HibernateResult{
		Name: name, State: StateHibernated, Template: t.ID, PauseMS: t.PauseMS,
		RAMFile: t.Hibernation, RAMBytes: stored, RAMSizeBytes: int64(t.Spec.MemoryMiB) << 20,
		ElapsedMS: ms(time.Since(start)),
	}, nil
}

// checkHibernateSpace refuses a hibernate, before the pause, when the state
// dir cannot take the RAM m holds in the mem dir now (its RAM file's
// allocated extents: an upper bound of what the sparse copy writes).
func (mg *Manager) checkHibernateSpace(m *Machine) error {
	need, err := overlay.AllocatedBytes(m.Paths.RAM)
	if err != nil {
		return nil // the copy will tell
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mg.Store.StateDir, &st); err != nil {
		return nil
	}
	if free := int64(st.Bavail) * st.Bsize; free < need {
		return fmt.Errorf("the state dir %s has %d MiB free, the machine's RAM needs up to %d MiB: %w", mg.Store.StateDir, free>>20, need>>20, ErrInvalid)
	}
	return nil
}

// prepareHibernation reserves m's template, journals the hibernate and
// records the template in m, in that order, as prepareFork does for a fork.
func (mg *Manager) prepareHibernation(m *Machine) (*Template, func(), error) {
	t, err := mg.Store.NewTemplate(m.Name)
	if err != nil {
		return nil, nil, err
	}
	t.Driver, t.Accel, t.Spec = m.Driver, m.Accel, m.Spec
	t.SourceParent, t.SourceTemplate, t.SourceGuestMAC = m.Parent, m.Template, m.GuestMAC
	t.Contract = m.Contract.Clone()
	t.Family = familyOf(m)
	if m.Spec.Disk == "" {
		t.Paths.Disk = ""
	}
	// The machine's own policies: its fresh and keep disks stay its own
	// (inPlaceDisks), and the forks of the hibernated machine get them
	// empty.
	if err := planTemplateDisks(m, t, nil); err != nil {
		mg.Store.RemoveTemplate(t.ID)
		return nil, nil, err
	}
	done, err := mg.Store.journal(journalEntry{Op: opHibernate, Source: m.Name, Template: t.ID})
	if err != nil {
		mg.Store.RemoveTemplate(t.ID)
		return nil, nil, err
	}
	m.Hibernated = t.ID // protects t from collectTemplates (gc.go)
	if err = mg.Store.SaveMachine(m); err == nil {
		err = mg.Store.WriteTemplate(t)
	}
	if err != nil {
		m.Hibernated = ""
		mg.Store.SaveMachine(m)
		done()
		mg.Store.RemoveTemplate(t.ID)
		return nil, nil, err
	}
	return t, done, nil
}

// endHibernated finishes the hibernate of machine m, hibernated (its record
// says so) into t: it ends m's QEMU, writes t's RAM sparse to disk unless it
// is there, and frees the mem dir of m's and t's RAM files. It returns the
// bytes written. Idempotent; if writing fails, m stays hibernated with its
// RAM in the mem dir, and the error says so.
func (mg *Manager) endHibernated(ctx context.Context, m *Machine, t *Template) (int64, error) {
	if err := mg.stopAll(ctx, m); err != nil {
		return 0, fmt.Errorf("end the QEMU process: %w", err)
	}
	if err := os.Remove(mg.Store.MachinePaths(m.Name).RAM); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("free RAM file: %w", err)
	}
	m.PID = 0
	if err := mg.Store.SaveMachine(m); err != nil {
		return 0, err
	}
	var stored int64
	if t.Hibernation == "" {
		img := filepath.Join(t.Paths.Dir, fileHibernatedRAM)
		os.Remove(img) // a copy a killed command began
		var err error
		if stored, err = copySparse(ctx, t.Paths.RAM, img, true); err != nil {
			return stored, fmt.Errorf("write RAM to %s: %w (the machine is hibernated with its RAM still in the mem dir)", img, err)
		}
		t.Hibernation = img
		if err := mg.Store.WriteTemplate(t); err != nil {
			return stored, err
		}
	} else {
		stored, _ = overlay.AllocatedBytes(t.Hibernation)
	}
	if err := os.Remove(t.Paths.RAM); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return stored, fmt.Errorf("free RAM file: %w", err)
	}
	return stored, nil
}

// thaw brings hibernated template t's RAM back to its place in the mem dir,
// unless it is there. The file on disk holds no zero pages, so its data
// extents are copied in the kernel (copy_file_range), holes kept. The copy
// appears whole or not at all: it is written under the temporary name that
// removeTempFiles knows.
func (s *Store) thaw(ctx context.Context, t *Template) error {
	if _, err := os.Stat(t.Paths.RAM); err == nil || t.Hibernation == "" {
		return nil
	}
	os.Remove(filepath.Join(filepath.Dir(t.Paths.RAM), "."+filepath.Base(t.Paths.RAM)+".tmp")) // a killed thaw's
	if _, err := sharedmem.Freeze(ctx, t.Hibernation, t.Paths.RAM); err != nil {
		return fmt.Errorf("bring RAM back from %s: %w", t.Hibernation, err)
	}
	return nil
}

// dropThawed removes the mem-dir copy of hibernated template t's RAM when
// no child maps it: the copy on disk holds it.
func (s *Store) dropThawed(t *Template) error {
	if t.Hibernation == "" {
		return nil // the RAM is not on disk yet (a hibernate in progress)
	}
	if _, err := os.Stat(t.Hibernation); err != nil {
		return nil
	}
	if err := os.Remove(t.Paths.RAM); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("template %q: %w", t.ID, err)
	}
	return nil
}

// copySparse copies file src to a new read-only file dst of the same
// length, writing only the pages of src's data that are not all zeros
// (sharedmem.ReadData, sharedmem.NonZeroPages): the rest stays holes. A
// guest's RAM is mostly untouched or freed pages, so dst holds little more
// than the memory the guest uses. With sync, dst is on stable storage when
// it returns. It returns the bytes written.
func copySparse(ctx context.Context, src, dst string, sync bool) (stored int64, err error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return 0, err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o400)
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if err := out.Truncate(fi.Size()); err != nil {
		return 0, err
	}
	err = sharedmem.ReadData(ctx, in, fi.Size(), func(off int64, p []byte) error {
		return sharedmem.NonZeroPages(p, func(i int, pg []byte) error {
			if _, err := out.WriteAt(pg, off+int64(i)); err != nil {
				return fmt.Errorf("write %s: %w", dst, err)
			}
			stored += int64(len(pg))
			return nil
		})
	})
	if err != nil {
		return stored, err
	}
	if sync {
		if err := out.Sync(); err != nil {
			return stored, fmt.Errorf("sync %s: %w", dst, err)
		}
	}
	return stored, nil
}

// hibernationEntry locks and loads what hibernate or resume entry e names,
// for their repairs: the machine (nil when rm took it since, or it is
// another driver's) and its template (terr when that is gone). ok is false
// while a live command holds the machine's name. unlock also removes the
// entry's temporary files.
func (mg *Manager) hibernationEntry(ctx context.Context, e journalEntry) (m *Machine, t *Template, terr error, unlock func(), ok bool) {
	release, err := mg.tryLock(ctx, e.Source)
	if err != nil {
		return nil, nil, nil, nil, false
	}
	unlock = func() {
		mg.Store.removeTempFiles(e.Template)
		release()
	}
	m, err = mg.Store.LoadMachine(e.Source)
	if err != nil || m.Driver != mg.Driver.Name() {
		return nil, nil, nil, unlock, true
	}
	t, terr = mg.Store.LoadTemplate(e.Template)
	return m, t, terr, unlock, true
}

// repairHibernate finishes or undoes a hibernate whose vmfork process died
// (journal.go): one that reached its commit is finished, one that did not
// leaves the machine running.
func (mg *Manager) repairHibernate(ctx context.Context, e journalEntry) (done bool, err error) {
	m, t, terr, unlock, ok := mg.hibernationEntry(ctx, e)
	if !ok {
		return false, nil
	}
	defer unlock()
	if m == nil || m.Hibernated != e.Template {
		return true, nil
	}
	log := mg.Log.WithFields(logrus.Fields{"machine": m.Name, "template": e.Template})
	fail := func(err error) (bool, error) {
		return false, fmt.Errorf("repair %q after an interrupted %s: %w", m.Name, e.Op, err)
	}
	if m.State == StateHibernated {
		if terr != nil {
			return fail(terr)
		}
		if err := mg.stopAll(ctx, m); err != nil {
			return fail(err) // tried again by the next command
		}
		if _, err := mg.endHibernated(ctx, m, t); err != nil {
			// Consistent as it is: hibernated, its RAM in the mem dir.
			log.WithError(err).Warn("a hibernate interrupted after its commit could not write the RAM to disk")
			return true, nil
		}
		log.Warn("finished a hibernate that was interrupted after its commit")
		return true, nil
	}
	// Not committed: the machine runs on (resumed if the freeze left it
	// paused), on the disk the freeze switched it to.
	if terr == nil {
		if err := mg.repairSourceDisk(ctx, m, t); err != nil {
			return fail(err)
		}
	}
	if forker, ok := mg.Driver.(Forker); ok {
		if st, _ := mg.Driver.Status(ctx, m); st != StateStopped {
			if err := forker.Resume(ctx, m); err != nil {
				return fail(err)
			}
		}
	}
	m.Hibernated = ""
	if err := mg.Store.SaveMachine(m); err != nil {
		return fail(err)
	}
	log.Warn("a machine whose hibernate was interrupted runs on")
	return true, nil
}
