package vmfork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// TTLs. A machine or kept template given a TTL carries its deadline in its
// record (Machine.Expires, Template.Expires). The deadline is enforced by a
// reaper: one small vmfork process per state dir and driver, started
// detached (its own session, no terminal, stdio on /dev/null) by the first
// command that sets a deadline, and gone again as soon as nothing in the
// store has one. It holds <state-dir>/reaper.<driver>.lock (flock, so a
// killed reaper frees it and the next command starts another) and records
// its PID in reaper.<driver>.pid, so it can be found and stopped.
//
// Why one reaper per store and not one watcher per machine (the way a
// containerd shim sits beside each container): a fork of a hundred children
// would start a hundred processes that each wait on one file; an extended
// deadline would have to reach the right one; and a machine removed early
// would leave its watcher to notice. The reaper reads the deadlines from the
// records on every round, so `vmfork extend` only writes the record, an
// early removal needs nothing, and explore branches whose explore died are
// found the same way. Why not a systemd timer or a libvirt feature: neither
// is on every host vmfork runs on (the test host has no systemd as PID 1,
// and the embedded driver needs no daemon), and libvirt has no expiring
// domains. The reaper polls once a second (reading a few small JSON files),
// which bounds how late a machine goes; `vmfork gc` does one round on demand.

// ReaperStarter starts a reaper process for the manager's store and driver.
// It must return without waiting for the reaper, which outlives the caller.
type ReaperStarter func(ctx context.Context) error

// MaxTTL bounds --ttl; longer lives need no reaper.
const MaxTTL = 366 * 24 * time.Hour

// Reaper timing.
const (
	// ReaperPoll is how often the reaper reads the deadlines.
	ReaperPoll = time.Second
	// reapTimeout bounds one removal, so a machine whose lock a long command
	// holds is retried on a later round instead of holding up the others.
	reapTimeout = 2 * time.Minute
)

func reaperLockPath(s *Store, driver string) string {
	return filepath.Join(s.StateDir, "reaper."+driver+".lock")
}

func reaperPIDPath(s *Store, driver string) string {
	return filepath.Join(s.StateDir, "reaper."+driver+".pid")
}

// CheckTTL checks a --ttl value: 0 means none.
func CheckTTL(d time.Duration) error {
	if d < 0 || d > MaxTTL {
		return fmt.Errorf("ttl %s must be from 0 (none) to %s: %w", d, MaxTTL, ErrInvalid)
	}
	return nil
}

// deadline is now+ttl, or zero for no TTL.
func deadline(now time.Time, ttl time.Duration) time.Time {
	if ttl == 0 {
		return time.Time{}
	}
	return now.Add(ttl).UTC().Round(time.Millisecond)
}

// SetTTL gives machine or kept template name the deadline now+ttl (0
// clears it) and makes sure a reaper runs. It returns the new deadline.
// It is what boot/fork/template save --ttl and vmfork extend do.
func (mg *Manager) SetTTL(ctx context.Context, name string, ttl time.Duration) (time.Time, error) {
	if err := CheckTTL(ttl); err != nil {
		return time.Time{}, fmt.Errorf("ttl %q: %w", name, err)
	}
	if err := ValidateName(name); err != nil {
		return time.Time{}, fmt.Errorf("ttl: %w", err)
	}
	unlock, err := mg.Store.Lock(ctx, name)
	if err != nil {
		return time.Time{}, fmt.Errorf("ttl %q: %w", name, err)
	}
	defer unlock()
	d := deadline(time.Now(), ttl)
	if m, err := mg.Store.LoadMachine(name); err == nil {
		m.Expires = d
		if err := mg.Store.SaveMachine(m); err != nil {
			return time.Time{}, fmt.Errorf("ttl %q: %w", name, err)
		}
	} else if t, terr := mg.Store.FindKept(name); terr == nil {
		t.Expires = d
		if err := mg.Store.WriteTemplate(t); err != nil {
			return time.Time{}, fmt.Errorf("ttl %q: %w", name, err)
		}
	} else {
		return time.Time{}, fmt.Errorf("ttl: %w", err)
	}
	if !d.IsZero() {
		if err := mg.EnsureReaper(ctx); err != nil {
			return d, fmt.Errorf("ttl %q: start the reaper: %w", name, err)
		}
	}
	return d, nil
}

// EnsureReaper starts a reaper unless one runs for this store and driver.
func (mg *Manager) EnsureReaper(ctx context.Context) error {
	if mg.Reaper == nil {
		mg.Log.Warn("no reaper can be started here: deadlines are enforced only by vmfork gc")
		return nil
	}
	// Whoever gets the lock for this test starts the reaper; a reaper that
	// misses the lock because of the test exits, and the tester starts
	// another, so there is always one.
	unlock, ok, err := mg.Store.tryReaperLock(mg.Driver.Name())
	if err != nil {
		return err
	}
	if !ok {
		return nil
	}
	unlock()
	return mg.Reaper(ctx)
}

// tryReaperLock takes the reaper lock without waiting; ok is false when
// another process holds it.
func (s *Store) tryReaperLock(driver string) (unlock func(), ok bool, err error) {
	f, err := os.OpenFile(reaperLockPath(s, driver), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("reaper lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("reaper lock: %w", err)
	}
	return func() { f.Close() }, true, nil
}

// ReapResult is one round of reaping. Its JSON form is vmfork gc's.
type ReapResult struct {
	// Removed are machines whose deadline passed, or branches of an
	// explore whose process died.
	Removed []string `json:"removed"`
	// Released are kept templates whose deadline passed: their names are
	// given up, and each goes once its last child has gone.
	Released []string `json:"released"`
	// Lost are kept templates whose RAM was lost with a host restart
	// (restart.go): gc gives their names up.
	Lost   []string     `json:"lost,omitempty"`
	Failed []ChildError `json:"failed,omitempty"`
	// Pending counts deadlines still to come and explores still running.
	Pending int `json:"pending"`
	// Chunks is how many chunks gc removed from the chunk store
	// (chunks.go): those no template's chunk map names.
	Chunks int `json:"chunks_removed,omitempty"`
	// Next is the nearest deadline to come.
	Next time.Time `json:"next_deadline,omitzero"`
}

func (r *ReapResult) wait(t time.Time) {
	r.Pending++
	if !t.IsZero() && (r.Next.IsZero() || t.Before(r.Next)) {
		r.Next = t
	}
}

// Reap removes what is due at now: machines of this manager's driver past
// their deadline, kept templates past theirs (given up, as template rm
// does), and the branches of explores whose process is gone. Machines
// without a deadline are never touched. The error joins the failures,
// which are retried on the next round.
func (mg *Manager) Reap(ctx context.Context, now time.Time) (ReapResult, error) {
	res := ReapResult{Removed: []string{}, Released: []string{}}
	var errs []error
	fail := func(name string, err error) {
		res.Failed = append(res.Failed, ChildError{Name: name, Error: err.Error()})
		errs = append(errs, err)
	}
	ms, err := mg.Store.ListMachines()
	if err != nil {
		return res, err
	}
	for _, m := range ms {
		if m.Expires.IsZero() || m.Driver != mg.Driver.Name() {
			continue
		}
		if now.Before(m.Expires) {
			res.wait(m.Expires)
			continue
		}
		if err := mg.reapMachine(ctx, m.Name, m.Expires); err != nil {
			fail(m.Name, err)
			continue
		}
		res.Removed = append(res.Removed, m.Name)
	}
	ts, err := mg.Store.ListTemplates()
	if err != nil {
		return res, err
	}
	for _, t := range ts {
		exp := t.Expires
		if exp.IsZero() {
			exp = forkToOrphanDeadline(t) // forkto_live.go
			if !exp.IsZero() && mg.Store.forkToAbandoned(t.Name) {
				exp = t.Created // its vmfork died mid-fork: due now
			}
		}
		if t.Name == "" || exp.IsZero() || t.Driver != mg.Driver.Name() {
			continue
		}
		if now.Before(exp) {
			res.wait(exp)
			continue
		}
		if _, err := mg.Unkeep(ctx, t.Name); err != nil && !errors.Is(err, ErrNotFound) {
			fail(t.Name, err)
			continue
		}
		mg.Log.WithField("template", t.Name).Info("kept template expired: name given up")
		res.Released = append(res.Released, t.Name)
	}
	mg.reapExplores(ctx, &res, fail, false)
	return res, joinLine(errs...)
}

// reapMachine removes machine name if its record still carries deadline
// exp (an extend in between moved it: then it stays).
func (mg *Manager) reapMachine(ctx context.Context, name string, exp time.Time) error {
	rctx, cancel := context.WithTimeout(ctx, reapTimeout)
	defer cancel()
	m, err := mg.Store.LoadMachine(name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil || !m.Expires.Equal(exp) {
		return err
	}
	if err := mg.Remove(rctx, name, true); err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("reap %q: %w", name, err)
	}
	mg.Log.WithField("machine", name).Info("machine expired: removed")
	return nil
}

// pending reports whether anything in the store waits for this driver's
// reaper: a deadline, or an explore in flight.
func (mg *Manager) pending() bool {
	ms, _ := mg.Store.ListMachines()
	for _, m := range ms {
		if !m.Expires.IsZero() && m.Driver == mg.Driver.Name() {
			return true
		}
	}
	ts, _ := mg.Store.ListTemplates()
	for _, t := range ts {
		if t.Name != "" && !t.Expires.IsZero() && t.Driver == mg.Driver.Name() {
			return true
		}
	}
	rs, _ := mg.Store.listExplores()
	return len(rs) > 0
}

// RunReaper is the reaper process's body: it reaps every poll (sooner when
// a deadline is nearer) until nothing is pending, then returns. When another
// reaper holds the lock it returns at once.
func (mg *Manager) RunReaper(ctx context.Context, poll time.Duration) error {
	unlock, ok, err := mg.Store.tryReaperLock(mg.Driver.Name())
	if err != nil || !ok {
		return err
	}
	pidPath := reaperPIDPath(mg.Store, mg.Driver.Name())
	if err := os.WriteFile(pidPath, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		unlock()
		return fmt.Errorf("reaper: %w", err)
	}
	defer func() { os.Remove(pidPath) }()
	mg.Log.WithField("driver", mg.Driver.Name()).Info("reaper started")
	for {
		res, err := mg.Reap(ctx, time.Now())
		if err != nil {
			mg.Log.WithError(err).Warn("reaping failed; retrying")
		}
		if res.Pending == 0 && len(res.Failed) == 0 {
			unlock()
			// A command may have set a deadline after this round read the
			// records, and seen the lock held: look once more, unlocked.
			if !mg.pending() {
				mg.Log.Info("nothing left to reap: reaper exits")
				return nil
			}
			if unlock, ok, err = mg.Store.tryReaperLock(mg.Driver.Name()); err != nil || !ok {
				return err // another reaper took over
			}
			continue
		}
		sleep := poll
		if !res.Next.IsZero() {
			sleep = min(sleep, max(time.Until(res.Next), 10*time.Millisecond))
		}
		select {
		case <-ctx.Done():
			unlock()
			return ctx.Err()
		case <-time.After(sleep):
		}
	}
}

// GC does on demand what the reaper and the next command would: it repairs
// interrupted forks, reaps what is due now and removes templates no machine
// needs.
func (mg *Manager) GC(ctx context.Context) (ReapResult, error) {
	if err := mg.Recover(ctx); err != nil {
		mg.Log.WithError(err).Warn("repairing an interrupted fork failed")
	}
	res, err := mg.Reap(ctx, time.Now())
	lost, lerr := mg.giveUpLost(ctx)
	res.Lost = append([]string{}, lost...)
	mg.collectTemplates(ctx)
	// After the templates: a template collected now frees its chunks too.
	n, cerr := mg.Store.collectChunks()
	res.Chunks = n
	return res, errors.Join(err, lerr, cerr)
}

// TTLLeft is what is left of a deadline at now, rounded to seconds; zero
// when there is no deadline or it has passed.
func TTLLeft(exp, now time.Time) time.Duration {
	if exp.IsZero() || !now.Before(exp) {
		return 0
	}
	return exp.Sub(now).Round(time.Second)
}

// joinLine joins errors like errors.Join, on one line: vmfork's errors are
// one line each.
func joinLine(errs ...error) error {
	var keep []error
	for _, e := range errs {
		if e != nil {
			keep = append(keep, e)
		}
	}
	switch len(keep) {
	case 0:
		return nil
	case 1:
		return keep[0]
	}
	format := strings.Repeat("%w; ", len(keep))
	args := make([]any, len(keep))
	for i, e := range keep {
		args[i] = e
	}
	return fmt.Errorf(format[:len(format)-2], args...)
}

// applyForkTTL gives a fork's reserved children their deadline before
// they start, and makes sure a reaper runs: if the forking process dies
// now, the journal's repair removes the children that never finished and
// the reaper those that did. Failures only weaken the TTL, so they are
// logged, not returned.
func (mg *Manager) applyForkTTL(ctx context.Context, ttl time.Duration, children []*Machine) {
	if ttl == 0 {
		return
	}
	d := deadline(time.Now(), ttl)
	for _, c := range children {
		c.Expires = d
		if err := mg.Store.SaveMachine(c); err != nil {
			mg.Log.WithField("machine", c.Name).WithError(err).Warn("could not record the deadline")
		}
	}
	if err := mg.EnsureReaper(ctx); err != nil {
		mg.Log.WithError(err).Warn("could not start the reaper: deadlines are enforced by vmfork gc")
	}
}
