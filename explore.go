package vmfork

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/vmfork/vmfork/contract"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/internal/proc"
)

// Branch-and-explore: fork one branch per try from a running machine or a
// kept template, run each try in its own branch through the guest agent,
// score the branches, keep the winner as an ordinary machine and remove the
// rest. Losers always die: an explore writes a record of its branches in
// <state-dir>/explore/ before it forks, and if its process dies the reaper
// (ttl.go) or vmfork gc removes every branch still listed there.

// Explore defaults and bounds.
const (
	DefaultTryTimeout = 5 * time.Minute
	DefaultTailBytes  = 512
	// maxChanged bounds the changed files listed per try, to keep the
	// result small enough for an agent's context; ChangedCount says how
	// many there were.
	maxChanged = 50
	dirExplore = "explore"
)

// ExploreRequest asks for one branch of Source per try.
type ExploreRequest struct {
	Source string
	// Tries are shell commands, each run with /bin/sh -c in its own branch.
	Tries      []string
	TryTimeout time.Duration // per try, and per score command; default DefaultTryTimeout
	// Watch are guest paths whose files a try's changes are listed under.
	Watch []string
	// Score is a shell command run in each branch after its try; the last
	// line of its stdout is a number, and the highest wins. Without it a
	// try that exits 0 wins, the fastest first.
	Score string
	// KeepAs names the machine the winner is kept as; empty keeps the
	// winner's branch under its own name.
	KeepAs      string
	KeepAll     bool // keep the losers too
	Parallel    int  // branches started and tried at once; default 4
	MaxChildren int  // default DefaultMaxChildren
	// TTL gives every branch kept (the winner too) a deadline; 0 for none.
	TTL       time.Duration
	TailBytes int    // stdout and stderr tails kept per try; default DefaultTailBytes
	Prefix    string // branches are PREFIX-1, PREFIX-2, ...; default SOURCE-try
	Identity  IdentityOptions
	// Contract is every branch's (contracts.go); nil: the source's.
	Contract *contract.Contract
}

// TryResult is one try. Its JSON form is kept small: an agent reads it.
type TryResult struct {
	Index      int     `json:"index"` // from 1, in the order given
	Command    string  `json:"command"`
	Branch     string  `json:"branch"`
	ExitCode   int     `json:"exit_code"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	DurationMS float64 `json:"duration_ms"`
	Stdout     string  `json:"stdout_tail"`
	Stderr     string  `json:"stderr_tail"`
	// Changed are the files under the watched paths the try added (A),
	// modified (M) or deleted (D), as "M /path"; at most maxChanged.
	Changed      []string `json:"changed,omitempty"`
	ChangedCount int      `json:"changed_count,omitempty"`
	Score        *float64 `json:"score,omitempty"`
	// Error says why the branch has no result of its own (it did not come
	// up, the agent failed, the score was not a number).
	Error string `json:"error,omitempty"`
	Kept  bool   `json:"kept"`
	// Claims are the keys the branch claimed in the family ledger
	// (explore_ledger.go); Released, those of a losing branch the explore
	// released when it removed it (claimed, never done).
	Claims   []TryClaim `json:"claims,omitempty"`
	Released []string   `json:"released,omitempty"`
}

// ExploreResult is an explore's outcome. Its JSON form is a contract.
type ExploreResult struct {
	Source   string `json:"source"`
	Template string `json:"template"`
	// Winner is the machine the winning try was kept as; empty when no
	// try won.
	Winner    string      `json:"winner,omitempty"`
	WinnerTry int         `json:"winner_try,omitempty"`
	Kept      []string    `json:"kept"`
	Removed   []string    `json:"removed"`
	PauseMS   float64     `json:"pause_ms"`
	Tries     []TryResult `json:"tries"`
	ElapsedMS float64     `json:"elapsed_ms"`
}

// ErrNoWinner means no try of an explore won; the result still lists them.
var ErrNoWinner = errors.New("no try won")

// exploreRecord lists the branches an explore in flight must remove if its
// process dies. Its process is named by PID and start time, so a reused PID
// is not mistaken for it.
type exploreRecord struct {
	PID      int       `json:"pid"`
	Start    uint64    `json:"start_ticks"`
	Source   string    `json:"source"`
	Branches []string  `json:"branches"`
	Started  time.Time `json:"started"`
	// Family is the branches' family, Winner the winning branch once
	// known: the reaper releases the ledger claims of the others.
	Family string `json:"family,omitempty"`
	Winner string `json:"winner,omitempty"`
	path   string
}

func (r *exploreRecord) alive() bool {
	st, err := procStart(r.PID)
	return err == nil && st == r.Start && proc.Running(r.PID)
}

// procStart reads a process's start time (clock ticks since boot) from
// /proc/PID/stat: the 20th field after the parenthesised command name.
func procStart(pid int) (uint64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}

func (s *Store) newExplore(source string, branches []string) (*exploreRecord, error) {
	dir := filepath.Join(s.StateDir, dirExplore)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("explore record: %w", err)
	}
	start, err := procStart(os.Getpid())
	if err != nil {
		return nil, fmt.Errorf("explore record: %w", err)
	}
	f, err := os.CreateTemp(dir, source+"-*.json")
	if err != nil {
		return nil, fmt.Errorf("explore record: %w", err)
	}
	f.Close()
	r := &exploreRecord{PID: os.Getpid(), Start: start, Source: source, Branches: branches, Started: time.Now().UTC(), path: f.Name()}
	if err := r.save(); err != nil {
		os.Remove(r.path)
		return nil, err
	}
	return r, nil
}

func (r *exploreRecord) save() error {
	if err := writeJSON(r.path, r); err != nil {
		return fmt.Errorf("explore record: %w", err)
	}
	return nil
}

func (s *Store) listExplores() ([]*exploreRecord, error) {
	dir := filepath.Join(s.StateDir, dirExplore)
	es, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("explore records: %w", err)
	}
	var rs []*exploreRecord
	for _, e := range es {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		r := &exploreRecord{path: filepath.Join(dir, e.Name())}
		if err := readJSON(r.path, r); err != nil {
			continue // being written, or torn by a crash: the writer's PID is unknown
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// reapingExplores marks a context in which explores are being reaped.
type reapingExplores struct{}

// reapDeadExplores removes the branches of explores whose process is gone;
// Recover calls it, so the next vmfork command does what the reaper would.
func (mg *Manager) reapDeadExplores(ctx context.Context) {
	var res ReapResult
	mg.reapExplores(ctx, &res, func(name string, err error) {
		mg.Log.WithField("machine", name).WithError(err).Warn("could not remove a branch of an explore that died")
	}, true)
}

// reapExplores removes the branches of explores whose process is gone.
// Unless repaired is set (the caller is Recover), it first repairs a fork
// such an explore may have died in.
func (mg *Manager) reapExplores(ctx context.Context, res *ReapResult, fail func(string, error), repaired bool) {
	// Remove repairs through Recover, which reaps explores: once is enough.
	if ctx.Value(reapingExplores{}) != nil {
		return
	}
	ctx = context.WithValue(ctx, reapingExplores{}, true)
	rs, _ := mg.Store.listExplores()
	for _, r := range rs {
		if r.alive() {
			res.wait(time.Time{})
			continue
		}
		if !repaired {
			// The explore may have died inside its fork: resume the source
			// first, as the next command would.
			if err := mg.Recover(ctx); err != nil {
				mg.Log.WithError(err).Warn("repairing an interrupted fork failed")
			}
			repaired = true
		}
		left := 0
		for _, b := range r.Branches {
			m, err := mg.Store.LoadMachine(b)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err == nil && m.Driver != mg.Driver.Name() {
				left++ // another driver's reaper removes it
				continue
			}
			if err := mg.reapMachine(ctx, b, m.Expires); err != nil {
				fail(b, err)
				left++
				continue
			}
			mg.Log.WithField("machine", b).Warn("removed a branch of an explore that died")
			res.Removed = append(res.Removed, b)
			if b != r.Winner {
				mg.releaseHeldBy(ctx, r.Family, b)
			}
		}
		if left == 0 {
			os.Remove(r.path)
		}
	}
}

// Explore forks one branch of req.Source per try, runs the tries, keeps the
// winner and removes the losers (all of them with KeepAll unset). Bad input
// is refused before anything is forked. When no try wins, every branch is
// removed (unless KeepAll) and the error wraps ErrNoWinner; the result
// lists the tries either way.
func (mg *Manager) Explore(ctx context.Context, req ExploreRequest) (res *ExploreResult, err error) {
	start := time.Now()
	// Checked whole before anything is made; the fork below plans again
	// under the source's lock.
	p, err := mg.planExplore(ctx, req)
	if err != nil {
		return nil, err
	}
	req, names := p.req, p.fork.names()
	family, _ := mg.FamilyOf(req.Source) // the branches' (familyOf): the fork checks the source
	rec, err := mg.Store.newExplore(req.Source, names)
	if err != nil {
		return nil, fmt.Errorf("explore %q: %w", req.Source, err)
	}
	rec.Family = family
	winner := "" // the winning try's branch: its claims stay
	if err := rec.save(); err != nil {
		return nil, fmt.Errorf("explore %q: %w", req.Source, err)
	}
	if err := mg.EnsureReaper(ctx); err != nil {
		mg.Log.WithError(err).Warn("could not start the reaper: a killed explore leaves its branches to vmfork gc")
	}
	// Whatever happens below, every branch not kept goes before Explore
	// returns; if this process dies, the record makes the reaper do it.
	keep := map[string]bool{}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reapTimeout)
		defer cancel()
		removed, rerr := mg.removeBranches(rctx, names, keep, req.Parallel)
		if res != nil {
			mg.releaseLosers(rctx, family, winner, removed, res.Tries)
			res.Removed = append(res.Removed, removed...)
			res.ElapsedMS = ms(time.Since(start))
		}
		if rerr == nil {
			os.Remove(rec.path)
		}
		err = joinLine(err, rerr)
	}()
	// The branches carry the TTL from the start: the deadline bounds the
	// explore's whole life, and that of every branch it keeps.
	fr, ferr := mg.Fork(ctx, p.fork.req)
	if fr == nil {
		return nil, fmt.Errorf("explore: %w", ferr)
	}
	res = &ExploreResult{Source: req.Source, Template: fr.Template, PauseMS: fr.PauseMS, Kept: []string{}, Removed: []string{}}
	mg.Log.WithFields(logrus.Fields{"machine": req.Source, "template": fr.Template, "branches": len(fr.Children)}).Info("branches forked")
	res.Tries = mg.runTries(ctx, req, names, fr)
	mg.recordClaims(ctx, family, res.Tries)
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("explore %q: %w", req.Source, err)
	}
	if w := pickWinner(res.Tries, req.Score != ""); w >= 0 {
		winner = res.Tries[w].Branch
	}
	err = mg.keepWinner(ctx, req, res, keep)
	// Only the branches to remove stay in the record from here on.
	rec.Branches, rec.Winner = nil, winner
	for _, n := range names {
		if !keep[n] {
			rec.Branches = append(rec.Branches, n)
		}
	}
	if serr := rec.save(); serr != nil {
		mg.Log.WithError(serr).Warn("could not update the explore record")
	}
	return res, err
}

// explorePlan is an explore checked whole: its branches' fork plan and
// the request with its defaults.
type explorePlan struct {
	req  ExploreRequest
	fork *forkPlan
}

// planExplore checks an explore and plans the fork of its branches, with
// no locks: the fork takes them when it runs. It changes nothing.
func (mg *Manager) planExplore(ctx context.Context, req ExploreRequest) (*explorePlan, error) {
	if err := mg.checkExplore(req); err != nil {
		return nil, fmt.Errorf("explore %q: %w", req.Source, err)
	}
	req = req.withDefaults()
	names, err := mg.branchNames(req)
	if err != nil {
		return nil, fmt.Errorf("explore %q: %w", req.Source, err)
	}
	fp, err := mg.planFork(ctx, ForkRequest{Source: req.Source, Names: names, Parallel: req.Parallel,
		MaxChildren: req.MaxChildren, Identity: req.Identity, TTL: req.TTL, Contract: req.Contract}, noLocks())
	if err != nil {
		return nil, fmt.Errorf("explore: %w", err)
	}
	return &explorePlan{req: req, fork: fp}, nil
}

// PlanExplore checks an explore as Explore does and says what it would do.
func (mg *Manager) PlanExplore(ctx context.Context, req ExploreRequest) (*Plan, error) {
	return dryRun(mg.planExplore(ctx, req))
}

func (p *explorePlan) render() *Plan {
	out := p.fork.render()
	out.Command = "explore"
	req := p.req
	for i, c := range p.fork.children {
		out.add("run try %d in branch %q (at most %v): %s", i+1, c.Name, req.TryTimeout, req.Tries[i])
	}
	how := "the first try to exit 0 wins"
	if req.Score != "" {
		how = "the try whose score (" + req.Score + ") is highest wins"
	}
	switch {
	case req.KeepAll:
		out.add("%s; keep every branch", how)
	case req.KeepAs != "":
		out.add("%s; fork it into %q and remove every branch", how, req.KeepAs)
	default:
		out.add("%s; keep it and remove the other branches", how)
	}
	return out
}

func (req ExploreRequest) withDefaults() ExploreRequest {
	if req.TryTimeout == 0 {
		req.TryTimeout = DefaultTryTimeout
	}
	if req.TailBytes == 0 {
		req.TailBytes = DefaultTailBytes
	}
	if req.Parallel <= 0 {
		req.Parallel = 4
	}
	return req
}

// keepWinner picks the winner and marks what to keep in keep: the winner
// (or, with KeepAs, the fork of it), and every branch with KeepAll.
func (mg *Manager) keepWinner(ctx context.Context, req ExploreRequest, res *ExploreResult, keep map[string]bool) error {
	if req.KeepAll {
		for _, t := range res.Tries {
			if mg.exists(t.Branch) {
				keep[t.Branch] = true
			}
		}
	}
	w := pickWinner(res.Tries, req.Score != "")
	if w < 0 {
		mg.markKept(res, keep)
		return fmt.Errorf("explore %q: none of %d tries won: %w", req.Source, len(res.Tries), ErrNoWinner)
	}
	winner := res.Tries[w].Branch
	res.Winner, res.WinnerTry = winner, res.Tries[w].Index
	keep[winner] = true
	if req.KeepAs != "" {
		if err := mg.keepAs(ctx, winner, req); err != nil {
			mg.markKept(res, keep)
			return fmt.Errorf("explore %q: keep the winner %q as %q: %w", req.Source, winner, req.KeepAs, err)
		}
		res.Winner = req.KeepAs
		if !req.KeepAll {
			delete(keep, winner)
		}
	}
	mg.markKept(res, keep)
	if req.KeepAs != "" {
		res.Kept = append([]string{req.KeepAs}, res.Kept...)
	}
	return nil
}

func (mg *Manager) exists(name string) bool {
	_, err := mg.Store.LoadMachine(name)
	return err == nil
}

func (mg *Manager) markKept(res *ExploreResult, keep map[string]bool) {
	for i := range res.Tries {
		if keep[res.Tries[i].Branch] {
			res.Tries[i].Kept = true
			res.Kept = append(res.Kept, res.Tries[i].Branch)
		}
	}
}

// keepAs keeps the winning branch under req.KeepAs. A running QEMU cannot
// be renamed (its sockets, its libvirt domain and its process's command
// line carry the name), so the winner is forked once more, into KeepAs: the
// new machine continues from the winner's instant with all its changes,
// and the branch goes with the losers.
func (mg *Manager) keepAs(ctx context.Context, winner string, req ExploreRequest) error {
	// The winner's contract goes on with it (the fork inherits it).
	_, err := mg.Fork(ctx, ForkRequest{Source: winner, Names: []string{req.KeepAs}, Identity: req.Identity, TTL: req.TTL})
	return err
}

func (mg *Manager) checkExplore(req ExploreRequest) error {
	if err := ValidateName(req.Source); err != nil {
		return err
	}
	max := req.MaxChildren
	if max <= 0 {
		max = DefaultMaxChildren
	}
	switch {
	case len(req.Tries) == 0:
		return fmt.Errorf("no try given (--try or --tries-file): %w", ErrInvalid)
	case len(req.Tries) > max:
		return fmt.Errorf("%d tries is over the limit of %d children (raise it with --max-children): %w", len(req.Tries), max, ErrInvalid)
	case req.TryTimeout < 0:
		return fmt.Errorf("try timeout %s must be positive: %w", req.TryTimeout, ErrInvalid)
	case req.TailBytes < 0:
		return fmt.Errorf("tail size %d must not be negative: %w", req.TailBytes, ErrInvalid)
	case req.Parallel < 0:
		return fmt.Errorf("parallel %d must be positive: %w", req.Parallel, ErrInvalid)
	}
	for i, t := range req.Tries {
		if strings.TrimSpace(t) == "" {
			return fmt.Errorf("try %d is empty: %w", i+1, ErrInvalid)
		}
	}
	for _, w := range req.Watch {
		if !strings.HasPrefix(w, "/") {
			return fmt.Errorf("watched path %q must be absolute: %w", w, ErrInvalid)
		}
	}
	if err := CheckTTL(req.TTL); err != nil {
		return err
	}
	if err := req.Identity.ValidateFor(len(req.Tries)); err != nil {
		return err
	}
	if _, err := mg.Store.LoadMachine(req.Source); err != nil {
		if _, kerr := mg.Store.FindKept(req.Source); kerr != nil {
			return err
		}
	}
	if req.KeepAs != "" {
		if err := ValidateName(req.KeepAs); err != nil {
			return fmt.Errorf("--keep-as: %w", err)
		}
		if mg.exists(req.KeepAs) {
			return fmt.Errorf("--keep-as: machine %q: %w", req.KeepAs, ErrExists)
		}
		if _, err := mg.Store.FindKept(req.KeepAs); err == nil {
			return fmt.Errorf("--keep-as: %q is a kept template: %w", req.KeepAs, ErrExists)
		}
	}
	return nil
}

// branchNames picks the next free names PREFIX-1, PREFIX-2, ...
func (mg *Manager) branchNames(req ExploreRequest) ([]string, error) {
	prefix := req.Prefix
	if prefix == "" {
		prefix = req.Source + "-try"
	}
	var names []string
	for i := 1; len(names) < len(req.Tries); i++ {
		n := fmt.Sprintf("%s-%d", prefix, i)
		if err := ValidateName(n); err != nil {
			return nil, fmt.Errorf("branch prefix %q: %w", prefix, err)
		}
		if _, err := mg.Store.FindKept(n); err == nil || n == req.KeepAs {
			continue
		}
		if _, err := mg.Store.LoadMachine(n); errors.Is(err, ErrNotFound) {
			names = append(names, n)
		}
	}
	return names, nil
}

// removeBranches removes the branches not in keep, parallel at once.
func (mg *Manager) removeBranches(ctx context.Context, names []string, keep map[string]bool, parallel int) ([]string, error) {
	var (
		mu      sync.Mutex
		removed []string
		errs    []error
		wg      sync.WaitGroup
	)
	sem := make(chan struct{}, max(parallel, 1))
	for _, n := range names {
		if keep[n] || !mg.exists(n) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			err := mg.Remove(ctx, n, true)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && !errors.Is(err, ErrNotFound) {
				errs = append(errs, fmt.Errorf("remove branch %q: %w", n, err))
				return
			}
			removed = append(removed, n)
		}()
	}
	wg.Wait()
	sort.Strings(removed)
	return removed, joinLine(errs...)
}
