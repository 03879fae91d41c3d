package ledger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Limits bound what one family's ledger holds. The zero value means the
// defaults.
type Limits struct {
	// Records is the most keys a family has records for (default 100 000).
	Records int
	// LogBytes bounds a family's log file (default 64 MiB); its live
	// records may take at most half of it, the rest being room for the log
	// to grow between compactions.
	LogBytes int64
}

// Default limits.
const (
	DefaultRecords  = 100_000
	DefaultLogBytes = 64 << 20
)

func (l Limits) withDefaults() Limits {
	if l.Records <= 0 {
		l.Records = DefaultRecords
	}
	if l.LogBytes <= 0 {
		l.LogBytes = DefaultLogBytes
	}
	return l
}

// StoreOptions configures a Store.
type StoreOptions struct {
	Limits Limits
	// Log receives warnings (a torn tail cut, a failed compaction); nil
	// discards them.
	Log *logrus.Entry
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// Store is the ledgers of every family under one directory,
// <dir>/families/<family>/log (log.go). Families are opened on first use
// and kept open until Sweep or Close. One process at a time may open a
// directory: the server holds its lock (Server.Run), and the Client opens
// a Store itself only under that lock. Its methods are safe for
// concurrent use; every change is synced to disk before the method
// returns, and so is every record a method's answer reflects.
type Store struct {
	root string
	lim  Limits
	log  *logrus.Entry
	now  func() time.Time

	mu     sync.Mutex
	fams   map[string]*famLog
	failed map[string]failure
	closed bool
}

// failure is a family that could not be opened (a corrupt log, a disk
// error): its error is answered for retryOpen, rather than the log being
// read again for each request a guest sends.
type failure struct {
	err error
	at  time.Time
}

const retryOpen = 5 * time.Second

// OpenStore opens the ledgers under dir, creating it.
func OpenStore(dir string, opt StoreOptions) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, dirFamilies), 0o700); err != nil {
		return nil, fmt.Errorf("ledger store: %w", err)
	}
	s := &Store{root: dir, lim: opt.Limits.withDefaults(), log: opt.Log, now: opt.Now, fams: map[string]*famLog{}, failed: map[string]failure{}}
	if s.log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		s.log = logrus.NewEntry(l)
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// errClosed is returned by a Store's methods after Close.
var errClosed = errors.New("ledger store closed")

// famLog is one family's open log and its records in memory.
//
// Group commit: a change is decided and written (no sync) under mu, which
// also numbers it (written); its caller then waits in syncTo until a
// fdatasync has covered that number. syncMu admits one fdatasync at a
// time, and the changes written while it runs are covered by the next, so
// N machines claiming at once cost about two syncs, not N. Reads note the
// number of the last change too and wait for it, so that no answer
// reflects a record a crash could still take back. Lock order: syncMu
// before mu, Store.mu before mu.
type famLog struct {
	id, dir string
	lim     Limits

	// Guarded by Store.mu.
	refs     int
	lastUsed time.Time
	retired  bool

	mu      sync.Mutex
	f       *os.File
	size    int64
	recs    map[string]*entry
	live    int64    // bytes the records' last entries take
	keys    []string // sorted keys; nil when a key was added since
	written uint64
	err     error // set when a write or sync failed: nothing more is done

	syncMu sync.Mutex
	synced uint64 // guarded by syncMu
}

type entry struct {
	Record
	size int64 // of its line in the log
}

func (s *Store) openFamily(id string) (*famLog, error) {
	dir := filepath.Join(s.root, dirFamilies, id)
	f, size, recs, cut, err := openLog(dir, id)
	if err != nil {
		return nil, fmt.Errorf("ledger of family %q: %w", id, err)
	}
	if cut > 0 {
		s.log.WithFields(logrus.Fields{"family": id, "bytes": cut}).Warn("cut a torn tail from the ledger log (a write a crash interrupted; it was never answered)")
	}
	fam := &famLog{id: id, dir: dir, lim: s.lim, f: f, size: size, recs: make(map[string]*entry, len(recs))}
	for k, r := range recs {
		line, err := encodeLine(r)
		if err != nil {
			f.Close()
			return nil, err
		}
		fam.recs[k] = &entry{Record: r, size: int64(len(line))}
		fam.live += int64(len(line))
	}
	return fam, nil
}

// acquire returns family id open, holding a reference unref drops.
func (s *Store) acquire(id string) (*famLog, error) {
	if err := CheckFamily(id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	f := s.fams[id]
	if f != nil && f.broken() {
		// Read it back from disk: what the failed write or sync left is
		// what the log says, and its callers were not answered.
		delete(s.fams, id)
		f.retired = true
		if f.refs == 0 {
			f.close()
		}
		f = nil
	}
	if f == nil {
		if fl, ok := s.failed[id]; ok && s.now().Sub(fl.at) < retryOpen {
			return nil, fl.err
		}
		var err error
		if f, err = s.openFamily(id); err != nil {
			s.failed[id] = failure{err: err, at: s.now()}
			return nil, err
		}
		delete(s.failed, id)
		s.fams[id] = f
	}
	f.refs++
	return f, nil
}

func (s *Store) unref(f *famLog) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f.refs--
	f.lastUsed = s.now()
	if f.retired && f.refs == 0 {
		f.close()
	}
}

// do runs op on family id and waits until the change it made, and every
// change it read, is on disk: op returns the number of the last change it
// depends on (0: none, as when it failed to write).
func (s *Store) do(id string, op func(f *famLog, now time.Time) (seq uint64, err error)) error {
	f, err := s.acquire(id)
	if err != nil {
		return err
	}
	defer s.unref(f)
	seq, err := op(f, s.now().UTC().Round(time.Millisecond))
	if seq > 0 {
		// Even a refusal (not holder, not claimed) waits: it too reflects
		// the records as they are.
		if serr := f.syncTo(seq, s.log); serr != nil {
			return serr
		}
	}
	return err
}

// Sweep closes the families no method is using that were last used before
// now-idle and that keep does not name (nil keeps none), freeing their
// memory; they are read again on their next use.
func (s *Store) Sweep(idle time.Duration, keep func(family string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, f := range s.fams {
		if f.refs > 0 || s.now().Sub(f.lastUsed) < idle || keep != nil && keep(id) {
			continue
		}
		delete(s.fams, id)
		f.close()
	}
}

// Close closes every family; methods called later fail. Changes were
// synced as they were made, so Close has nothing to flush.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var errs []error
	for id, f := range s.fams {
		delete(s.fams, id)
		f.retired = true
		if f.refs == 0 {
			errs = append(errs, f.close())
		}
	}
	return errors.Join(errs...)
}

func (f *famLog) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f == nil {
		return nil
	}
	err := f.f.Close()
	f.f = nil
	if f.err == nil {
		f.err = errClosed
	}
	return err
}

func (f *famLog) broken() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err != nil
}

// put writes r as its key's new state (under f.mu). Nothing changes when
// it fails.
func (f *famLog) put(r Record) error {
	if f.err != nil {
		return fmt.Errorf("family %q: %w", f.id, ErrStorage)
	}
	line, err := encodeLine(r)
	if err != nil {
		return err
	}
	n := int64(len(line))
	old := f.recs[r.Key]
	grow := n
	if old != nil {
		grow -= old.size
	}
	switch {
	case old == nil && len(f.recs) >= f.lim.Records:
		return fmt.Errorf("family %q has %d records: %w", f.id, len(f.recs), ErrFull)
	case grow > 0 && r.State != Released && f.live+grow > f.lim.LogBytes/2,
		f.size+n > f.lim.LogBytes:
		// Releases are let through the first bound (they grow a record by
		// a few bytes and free the key), never through the second.
		return fmt.Errorf("family %q: its log would pass %d bytes: %w", f.id, f.lim.LogBytes, ErrFull)
	}
	if _, err := f.f.WriteAt(line, f.size); err != nil {
		// Take back what part of the line may have reached the file, or
		// stop using the log: a later line must never follow a torn one.
		if terr := f.f.Truncate(f.size); terr != nil {
			f.err = terr
		}
		return fmt.Errorf("family %q: %w: %w", f.id, ErrStorage, err)
	}
	f.size += n
	f.written++
	f.live += grow
	if old == nil {
		f.keys = nil
	}
	f.recs[r.Key] = &entry{Record: r, size: n}
	return nil
}

// syncTo returns once change seq is on disk (see family).
func (f *famLog) syncTo(seq uint64, log *logrus.Entry) error {
	f.syncMu.Lock()
	defer f.syncMu.Unlock()
	if f.synced >= seq {
		return nil
	}
	f.mu.Lock()
	target, file, ferr := f.written, f.f, f.err
	f.mu.Unlock()
	if ferr != nil {
		return fmt.Errorf("family %q: %w: %w", f.id, ErrStorage, ferr)
	}
	if err := unix.Fdatasync(int(file.Fd())); err != nil {
		// After a failed fdatasync the kernel may have dropped the dirty
		// pages: what is on disk is unknown until the log is read again.
		f.mu.Lock()
		f.err = err
		f.mu.Unlock()
		return fmt.Errorf("family %q: sync: %w: %w", f.id, ErrStorage, err)
	}
	f.synced = target
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.size > compactMin && f.size > 2*f.live || f.size+2*maxEntry > f.lim.LogBytes {
		if err := f.compact(); err != nil {
			// The old log is whole and synced: go on with it, and try again
			// after the next sync. Only a log that was replaced but whose
			// directory was not synced stops the family (f.err).
			log.WithField("family", f.id).WithError(err).Warn("ledger log compaction failed")
		}
	}
	return nil
}

// compact rewrites the log with the live records only (under syncMu and
// mu). Every change is in the new log, which is synced.
func (f *famLog) compact() error {
	recs := make([]Record, 0, len(f.recs))
	for _, k := range f.sortedKeys() {
		recs = append(recs, f.recs[k].Record)
	}
	nf, size, replaced, err := writeCompacted(f.dir, f.id, recs)
	if err != nil {
		if replaced {
			f.err = err
		}
		return err
	}
	f.f.Close()
	f.f, f.size = nf, size
	f.synced = f.written
	return nil
}

func (f *famLog) sortedKeys() []string {
	if f.keys == nil {
		f.keys = make([]string, 0, len(f.recs))
		for k := range f.recs {
			f.keys = append(f.keys, k)
		}
		sort.Strings(f.keys)
	}
	return f.keys
}

// Outcome is how a claim was answered.
type Outcome string

// The outcomes of a claim.
const (
	// Granted: the key is now the caller's; no one had it.
	Granted Outcome = "granted"
	// Yours: the caller already holds it (it claimed it before and was
	// rewound, or its earlier answer was lost): its own claim, not a new one.
	Yours Outcome = "yours"
	// Taken: another machine of the family holds it, or held it and is done.
	Taken Outcome = "taken"
)

// Claim is the answer to a claim: the outcome and the key's record.
type Claim struct {
	Outcome Outcome
	Record  Record
}

// Line is the claim's answer on the port: `granted`, `yours AT [done
// [RESULT]]` or `taken HOLDER AT [done [RESULT]]`, AT being the claim's
// time.
func (c Claim) Line() string {
	var s string
	switch c.Outcome {
	case Granted:
		return "granted"
	case Yours:
		s = "yours " + stamp(c.Record.ClaimedAt)
	default:
		s = "taken " + c.Record.Holder + " " + stamp(c.Record.ClaimedAt)
	}
	if c.Record.State == Done {
		s = joinResult(s+" done", c.Record.Result)
	}
	return s
}

// Claim claims key for machine in family: granted if no machine of the
// family holds it (never claimed, or released), else the holder's record.
// A granted claim is on disk before Claim returns.
func (s *Store) Claim(family, machine, key string) (Claim, error) {
	if err := errors.Join(CheckName(machine), CheckKey(key)); err != nil {
		return Claim{}, err
	}
	var c Claim
	err := s.do(family, func(f *famLog, now time.Time) (uint64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if e := f.recs[key]; e != nil && e.State != Released {
			c = Claim{Outcome: Taken, Record: e.Record}
			if e.Holder == machine {
				c.Outcome = Yours
			}
			return f.written, nil
		}
		r := Record{Key: key, State: Claimed, Holder: machine, ClaimedAt: now}
		if err := f.put(r); err != nil {
			return 0, err
		}
		c = Claim{Outcome: Granted, Record: r}
		return f.written, nil
	})
	return c, err
}

// Done records that machine, the key's holder, did its effect, with an
// optional result. Done again by the holder is a no-op that keeps the
// first result.
func (s *Store) Done(family, machine, key, result string) (Record, error) {
	if err := errors.Join(CheckName(machine), CheckKey(key), CheckResult(result)); err != nil {
		return Record{}, err
	}
	var out Record
	err := s.do(family, func(f *famLog, now time.Time) (uint64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		e := f.recs[key]
		switch {
		case e == nil || e.State == Released:
			return f.written, fmt.Errorf("done %q: %w", key, ErrNotClaimed)
		case e.Holder != machine:
			return f.written, &HolderError{Holder: e.Holder}
		case e.State == Done:
			out = e.Record
			return f.written, nil
		}
		r := e.Record
		r.State, r.DoneAt, r.Result = Done, now, result
		if err := f.put(r); err != nil {
			return 0, err
		}
		out = r
		return f.written, nil
	})
	return out, err
}

// ReleaseOwn releases key for machine, its holder, so that the next claim
// of it is granted to whoever asks. A done key cannot be released by its
// holder (the effect happened); an operator can (Release).
func (s *Store) ReleaseOwn(family, machine, key string) (Record, error) {
	if err := errors.Join(CheckName(machine), CheckKey(key)); err != nil {
		return Record{}, err
	}
	return s.releaseKey(family, key, machine)
}

// Release releases key whatever its holder and state: the operator's
// release of a claim whose holder died, or of a done key whose effect is
// to be done again. It returns the released record.
func (s *Store) Release(family, key string) (Record, error) {
	if err := CheckKey(key); err != nil {
		return Record{}, err
	}
	return s.releaseKey(family, key, "")
}

func (s *Store) releaseKey(family, key, machine string) (Record, error) {
	var out Record
	err := s.do(family, func(f *famLog, now time.Time) (uint64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		e := f.recs[key]
		switch {
		case e == nil || e.State == Released:
			return f.written, fmt.Errorf("release %q: %w", key, ErrNotClaimed)
		case machine != "" && e.Holder != machine:
			return f.written, &HolderError{Holder: e.Holder}
		case machine != "" && e.State == Done:
			return f.written, fmt.Errorf("release %q: %w", key, ErrAlreadyDone)
		}
		r := e.Record
		r.State, r.ReleasedAt, r.ReleasedBy = Released, now, machine
		if machine == "" {
			r.ReleasedBy = ByOperator
		}
		if err := f.put(r); err != nil {
			return 0, err
		}
		out = r
		return f.written, nil
	})
	return out, err
}

// ReleaseHeldBy releases every key machine holds and has not reported
// done, and returns them: what explore does to a losing branch it reaps
// (its effects never happened; its done keys stay done).
func (s *Store) ReleaseHeldBy(family, machine string) ([]Record, error) {
	if err := CheckName(machine); err != nil {
		return nil, err
	}
	out := []Record{}
	err := s.do(family, func(f *famLog, now time.Time) (uint64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, k := range f.sortedKeys() {
			e := f.recs[k]
			if e.Holder != machine || e.State != Claimed {
				continue
			}
			r := e.Record
			r.State, r.ReleasedAt, r.ReleasedBy = Released, now, ByOperator
			if err := f.put(r); err != nil {
				// Those released so far are written and get synced.
				return f.written, err
			}
			out = append(out, r)
		}
		return f.written, nil
	})
	return out, err
}

// Get returns key's record, or ErrNotFound.
func (s *Store) Get(family, key string) (Record, error) {
	if err := CheckKey(key); err != nil {
		return Record{}, err
	}
	var out Record
	found := false
	err := s.do(family, func(f *famLog, _ time.Time) (uint64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if e := f.recs[key]; e != nil {
			out, found = e.Record, true
		}
		return f.written, nil
	})
	if err == nil && !found {
		err = fmt.Errorf("key %q: %w", key, ErrNotFound)
	}
	return out, err
}

// List returns every record of family, sorted by key.
func (s *Store) List(family string) ([]Record, error) {
	return s.filter(family, func(Record) bool { return true })
}

// KeysOf returns the records whose holder is machine, in any state: the
// keys it claimed (and did not lose to a release and another's claim).
func (s *Store) KeysOf(family, machine string) ([]Record, error) {
	if err := CheckName(machine); err != nil {
		return nil, err
	}
	return s.filter(family, func(r Record) bool { return r.Holder == machine })
}

func (s *Store) filter(family string, keep func(Record) bool) ([]Record, error) {
	out := []Record{}
	err := s.do(family, func(f *famLog, _ time.Time) (uint64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, k := range f.sortedKeys() {
			if r := f.recs[k].Record; keep(r) {
				out = append(out, r)
			}
		}
		return f.written, nil
	})
	return out, err
}

// Page returns up to n records with keys after after ("" for the first),
// sorted by key, and whether more follow: a `list` answer.
func (s *Store) Page(family, after string, n int) (recs []Record, more bool, err error) {
	err = s.do(family, func(f *famLog, _ time.Time) (uint64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		keys := f.sortedKeys()
		i, _ := slices.BinarySearch(keys, after)
		if i < len(keys) && keys[i] == after {
			i++
		}
		for ; i < len(keys) && len(recs) < n; i++ {
			recs = append(recs, f.recs[keys[i]].Record)
		}
		more = i < len(keys)
		return f.written, nil
	})
	return recs, more, err
}
