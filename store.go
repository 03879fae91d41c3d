package vmfork

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Store is vmfork's state on disk: machine records and templates under the
// state dir, guest RAM files under the mem dir (a tmpfs). Nothing outside
// these two directories is written.
type Store struct {
	StateDir string
	MemDir   string
}

// DefaultStateDir is /var/lib/vmfork for root and $XDG_STATE_HOME/vmfork
// (or ~/.local/state/vmfork) otherwise.
func DefaultStateDir() string {
	home, _ := os.UserHomeDir()
	return defaultStateDir(os.Geteuid(), os.Getenv("XDG_STATE_HOME"), home)
}

func defaultStateDir(uid int, xdgState, home string) string {
	if uid == 0 {
		return "/var/lib/vmfork"
	}
	if xdgState != "" {
		return filepath.Join(xdgState, "vmfork")
	}
	return filepath.Join(home, ".local", "state", "vmfork")
}

// DefaultMemDir is where guest RAM files live, a tmpfs: /dev/shm/vmfork for
// root and /dev/shm/vmfork-UID for anyone else, so that two users never
// share one (OpenStore refuses a directory another user owns). Not
// $XDG_RUNTIME_DIR: systemd sizes it to 10% of RAM, too small for guests,
// and su, runuser and cron leave it unset.
func DefaultMemDir() string {
	return defaultMemDir(os.Geteuid())
}

func defaultMemDir(uid int) string {
	if uid == 0 {
		return "/dev/shm/vmfork"
	}
	return "/dev/shm/vmfork-" + strconv.Itoa(uid)
}

// OpenStore creates the store's directories if needed.
func OpenStore(stateDir, memDir string) (*Store, error) {
	if stateDir == "" || memDir == "" {
		return nil, fmt.Errorf("state dir and mem dir must be set: %w", ErrInvalid)
	}
	s := &Store{StateDir: filepath.Clean(stateDir), MemDir: filepath.Clean(memDir)}
	for _, d := range []string{
		s.StateDir, s.MemDir,
		filepath.Join(s.StateDir, dirMachines), filepath.Join(s.StateDir, dirTemplates),
		filepath.Join(s.StateDir, dirJournal), filepath.Join(s.StateDir, dirLocks),
		filepath.Join(s.StateDir, dirPool),
	} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	// Only vmfork reads machine records, sockets, disks and guest RAM: a top
	// directory another user owns is refused (in /dev/shm anyone may make
	// one first, and its owner could read or swap what vmfork puts there),
	// and one made before loses read and write for group and others. Search for others stays where it was given: the
	// libvirt driver grants it so that an adopted domain's QEMU, running as
	// libvirt's user, reaches the files vmfork names to it.
	for _, d := range []string{s.StateDir, s.MemDir} {
		st, err := os.Stat(d)
		if err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		if err := ownedByMe(d, st); err != nil {
			return nil, err
		}
		if perm := st.Mode().Perm(); perm&0o066 != 0 {
			if err := os.Chmod(d, perm&^0o066); err != nil {
				return nil, fmt.Errorf("open store: make %s private: %w", d, err)
			}
		}
	}
	return s, nil
}

// ownedByMe fails with one line when directory d (st) belongs to another
// user than the one running vmfork.
func ownedByMe(d string, st os.FileInfo) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || int(sys.Uid) == os.Geteuid() {
		return nil
	}
	return fmt.Errorf("open store: %s belongs to uid %d, not to you (uid %d): vmfork keeps each user's machines and RAM apart; choose your own with --state-dir/--mem-dir: %w",
		d, sys.Uid, os.Geteuid(), ErrInvalid)
}

// MachinePaths returns the files of machine name. RAM is the machine's own
// share=on RAM file; fork children replace it with their template's.
func (s *Store) MachinePaths(name string) Paths {
	dir := filepath.Join(s.StateDir, dirMachines, name)
	return Paths{
		Dir:       dir,
		Disk:      filepath.Join(dir, fileDisk),
		QMP:       filepath.Join(dir, fileQMP),
		QGA:       filepath.Join(dir, fileQGA),
		Ledger:    filepath.Join(dir, fileLedger),
		Serial:    filepath.Join(dir, fileSerial),
		Log:       filepath.Join(dir, fileQEMULog),
		RAM:       filepath.Join(s.MemDir, name+ramSuffix),
		RAMShared: true,
	}
}

// CreateMachine reserves m.Name by creating its directory and writes its
// record. It fails with ErrExists if the name is taken.
func (s *Store) CreateMachine(m *Machine) error {
	if err := ValidateName(m.Name); err != nil {
		return err
	}
	if err := s.notKept(m.Name); err != nil {
		return err
	}
	dir := filepath.Join(s.StateDir, dirMachines, m.Name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("machine %q: %w", m.Name, ErrExists)
		}
		return fmt.Errorf("machine %q: %w", m.Name, err)
	}
	if err := s.SaveMachine(m); err != nil {
		os.RemoveAll(dir)
		return err
	}
	return nil
}

// nameFree returns nil when neither a machine nor a kept template has
// name, and otherwise the error CreateMachine would return (ErrExists). It
// is the plans' check: CreateMachine itself relies on mkdir, which no
// other command can race.
func (s *Store) nameFree(name string) error {
	if _, err := os.Lstat(filepath.Join(s.StateDir, dirMachines, name)); err == nil {
		return fmt.Errorf("machine %q: %w", name, ErrExists)
	}
	return s.notKept(name)
}

// notKept fails with ErrExists when a template is kept under name: kept
// template names share the namespace of machine names.
func (s *Store) notKept(name string) error {
	if t, err := s.FindKept(name); err == nil {
		return fmt.Errorf("machine %q: the name belongs to kept template %q: %w", name, t.ID, ErrExists)
	}
	return nil
}

// SaveMachine writes m's record atomically.
func (s *Store) SaveMachine(m *Machine) error {
	path := filepath.Join(s.StateDir, dirMachines, m.Name, fileMachine)
	if m.State == StateRunning {
		// Saved while it runs, under this boot: a restart shows later
		// (stopreason.go).
		m.HostBoot, m.StopReason = hostBootID(), ""
	}
	if err := writeJSON(path, m); err != nil {
		return fmt.Errorf("machine %q: save record: %w", m.Name, err)
	}
	return nil
}

// LoadMachine reads machine name's record; ErrNotFound if there is none.
func (s *Store) LoadMachine(name string) (*Machine, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	var m Machine
	path := filepath.Join(s.StateDir, dirMachines, name, fileMachine)
	if err := readJSON(path, &m); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("machine %q: %w", name, ErrNotFound)
		}
		return nil, fmt.Errorf("machine %q: %w", name, err)
	}
	return &m, nil
}

// ListMachines returns every machine record, sorted by name. A directory
// whose record cannot be read is skipped: it is a machine being created or
// removed right now.
func (s *Store) ListMachines() ([]*Machine, error) {
	entries, err := os.ReadDir(filepath.Join(s.StateDir, dirMachines))
	if err != nil {
		return nil, fmt.Errorf("list machines: %w", err)
	}
	var ms []*Machine
	for _, e := range entries {
		if !e.IsDir() || ValidateName(e.Name()) != nil {
			continue
		}
		m, err := s.LoadMachine(e.Name())
		if err != nil {
			continue
		}
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
	return ms, nil
}

// RemoveMachine deletes machine name's directory and its own RAM file, and
// the files of the warm-pool process it was started as (pool.go). It never
// touches a template's RAM file. The record goes in one step, a rename into
// the trash (.rm.<name> beside it), so a reader, or a command killed midway,
// sees the whole machine or none of it; what a killed removal left in the
// trash goes with the next removal of that name (an rm's journal entry
// makes the repair do it, journal.go).
func (s *Store) RemoveMachine(name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	p := s.MachinePaths(name)
	trash := filepath.Join(s.StateDir, dirMachines, trashPrefix+name)
	if err := s.emptyTrash(name, trash); err != nil {
		return err
	}
	// The RAM file first: once the record is gone, a new machine of that
	// name may be booting and own a file of that name.
	if err := os.Remove(p.RAM); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("machine %q: remove RAM file: %w", name, err)
	}
	if err := os.Rename(p.Dir, trash); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("machine %q: remove record: %w", name, err)
	}
	Fault(FaultRmRemoving, 0)
	return s.emptyTrash(name, trash)
}

// trashPrefix starts the name of a machine directory being removed; no
// machine name starts with a dot.
const trashPrefix = ".rm."

// emptyTrash deletes a machine directory moved to trash, with the pool
// directory its record names.
func (s *Store) emptyTrash(name, trash string) error {
	var m Machine
	if err := readJSON(filepath.Join(trash, fileMachine), &m); err == nil && s.inPool(m.Paths.Dir) {
		if err := os.RemoveAll(m.Paths.Dir); err != nil {
			return fmt.Errorf("machine %q: remove directory: %w", name, err)
		}
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("machine %q: remove directory: %w", name, err)
	}
	return nil
}

// removeTempFiles removes the temporary files of template id in the mem
// dir, <mem-dir>/.<id>.ram.tmp*: the freeze's RAM copy, renamed into place
// when done, and a starting child's own RAM file (qemudrv), removed once
// the template is mapped. Left by a command killed midway, the first would
// make every later freeze into that id fail, the second would hold tmpfs.
// The caller holds the lock of the name whose commands use them.
func (s *Store) removeTempFiles(id string) {
	tmps, _ := filepath.Glob(filepath.Join(s.MemDir, "."+id+ramSuffix+".tmp*"))
	for _, f := range tmps {
		os.Remove(f)
	}
}

// clearTemplateRAM removes the RAM files of template id in the mem dir: its
// full file and a delta's two. Only for a template whose record holds no
// memory.
func (s *Store) clearTemplateRAM(id string) {
	os.Remove(s.TemplatePaths(id).RAM)
	s.removeRAMDelta(id)
}

// clearTemplateID removes whatever files of template id a dead command left
// in the mem dir. Its caller has just reserved the id (its directory did
// not exist), so no live template owns them.
func (s *Store) clearTemplateID(id string) {
	s.removeTempFiles(id)
	os.Remove(s.TemplatePaths(id).RAM)
	s.removeRAMDelta(id)
}

// Lock takes the exclusive lock of name (a machine or template), waiting
// until ctx ends. Locks are flock(2) locks on files under <state-dir>/locks,
// so a killed CLI releases them.
func (s *Store) Lock(ctx context.Context, name string) (unlock func(), err error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	path := filepath.Join(s.StateDir, dirLocks, name+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %q: %w", name, err)
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %q: %w", name, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %q: held by another vmfork command: %w", name, ctx.Err())
		case <-t.C:
		}
	}
}

// writeJSON writes v to path through a temporary file and a rename, so a
// reader sees the old or the new record, never half of one.
func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, append(data, '\n'), 0o600)
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	return nil
}
