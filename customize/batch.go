package customize

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// Batching. Every guest command costs a round trip through the agent and a
// process start in the guest, tens of milliseconds each in a fresh fork
// child under TCG, where most of a step's own work takes a few. So the steps
// that work in the guest give Run a Part, the shell code of their work, and
// Run joins consecutive parts into one script that the guest runs in one
// command; the script reports every part's outcome, and the steps keep their
// names, results, timeouts (see below) and --skip-step.
//
// Each part runs in a subshell of its own: its exit, set -e and variables
// stay its own, as they would in a command of its own. It exits 0 when it did
// its work (its stdout is its detail), exitNothingToDo when there was nothing
// to do (its stdout says why) and anything else when it failed (its stderr
// says why). The first part that fails ends the script. Parts never share
// shell state; one that leaves something for a later one writes a file.
//
// A subshell is a fork, a few milliseconds in a fresh child under TCG, so a
// short part may say Inline: it then runs in the batch's own shell and keeps
// the contract by discipline instead: it ends with return (an exit would
// end the batch), sets no shell option (no set -e), trap, umask, directory
// or exported variable, and declares its variables local
// (TestInlinePartsLeaveTheShellAlone checks the scripts).
//
// Timeouts: a batch runs under the sum of its steps' timeouts; when that
// runs out the step whose part was running is the one that timed out. A
// part that waits (DHCP) bounds its wait by its own step's timeout.

// Part is a step's work as shell code in a batch.
type Part struct {
	// Script is the body of a shell function; Args are its $1, $2, ...
	Script string
	Args   []string
	// Input, when set, is the part's input, in the shell variable
	// $vmfork_input; every part's stdin is /dev/null. Only the first part
	// with input in a batch gets it: Run starts a new batch for a second.
	//
	// It comes in the batch's environment, which the batch's shell unsets
	// before any part runs, so that no process it starts inherits it. Not
	// the command line, which every guest user can read in /proc (the
	// environment only root can); not stdin, which every shell's read takes
	// a byte per system call, since it may not read past a line it returns
	// (the SSH keys' 4.4 KB took 90-160 ms so in a fresh Debian child).
	Input []byte
	// Inline runs the part in the batch's shell, not a subshell (see
	// above): its script returns instead of exiting.
	Inline bool
	// LinkUp says the host raises the child's link before this part runs,
	// which ends the batch before it: the parts before run with the link
	// down, this one and those after with it up.
	LinkUp bool
	// Last moves the part to the end of the steps' last batch, after every
	// other part, for work nothing after it needs and that would compete
	// with it for the guest's CPU: in a fresh Debian child under TCG,
	// journald's restart for the new machine-id ran alongside the DHCP
	// client and made it 1 s slower. A failure before it leaves it unrun.
	Last bool
	// Done, when set, takes the part's stdout after it succeeded; without
	// it the trimmed stdout is the step's detail.
	Done func(env *Env, out string) error
	// Fail, when set, builds the error of a part that failed from its exit
	// code, stdout and stderr; without it the error is an *ExitError.
	Fail func(code int, out, stderr string) error
}

// PartFunc prepares a step's Part on the host: it computes what the guest
// needs (a hostname, a machine-id, SSH keys) and may return several parts
// (run in order, each can raise the link) or Skipped.
type PartFunc func(ctx context.Context, env *Env) ([]*Part, error)

// batchMark starts the lines that frame each part's output; no tool writes
// it (ASCII record separator). scripts/batch-head.sh prints it as
// \036vmfork.
const batchMark = "\x1evmfork"

// partEnd ends each part's function in a batch script.
const partEnd = " # vmfork part end"

// inputVar is the environment variable that brings a batch its input.
const inputVar = "VMFORK_INPUT"

// batchItem is one part in a batch, with the step it belongs to.
type batchItem struct {
	step Step
	part *Part
	last bool // the step's last part
}

// buildBatch returns the script and its arguments for items: the batch's
// head (scripts/batch-head.sh), a function per part, then one vmfork_run per
// part. Arguments go through "$@" in groups
// (count, then the values), never into the script's text, so nothing in
// them is ever parsed as shell.
func buildBatch(items []batchItem, status string) (script string, args []string, input []byte) {
	var b strings.Builder
	b.WriteString(batchHead)
	b.WriteByte('\n')
	for i, it := range items {
		fmt.Fprintf(&b, "vmfork_part_%d() {\n%s\n}%s\n", i+1, it.part.Script, partEnd)
	}
	b.WriteString("VMFORK_STATUS=$1\nshift\n")
	args = append(args, status)
	for i, it := range items {
		if it.part.Input != nil && input == nil {
			input = it.part.Input
		}
		// The shell has no arrays: the part's values are the next n
		// positional parameters, shifted off after its run.
		n := len(it.part.Args)
		var refs strings.Builder
		for k := 1; k <= n; k++ {
			fmt.Fprintf(&refs, ` "${%d}"`, k+1)
		}
		sub := "1"
		if it.part.Inline {
			sub = "0"
		}
		fmt.Fprintf(&b, "vmfork_run %d %s%s || exit 0\nshift %d\n", i+1, sub, refs.String(), n+1)
		args = append(args, strconv.Itoa(n))
		args = append(args, it.part.Args...)
	}
	return b.String(), args, input
}

// partOutcome is what the script said of one part.
type partOutcome struct {
	ran      bool
	code     int
	duration time.Duration
	stdout   string
	stderr   string
}

// parseBatch splits a batch's stdout and stderr into the outcomes of its n
// parts.
func parseBatch(n int, stdout, stderr []byte) []partOutcome {
	out := make([]partOutcome, n)
	for _, seg := range bytes.Split(stdout, []byte(batchMark+" part ")) {
		nl := bytes.IndexByte(seg, '\n')
		if nl < 0 {
			continue
		}
		i, err := strconv.Atoi(string(seg[:nl]))
		if err != nil || i < 1 || i > n {
			continue
		}
		body := seg[nl+1:]
		o := &out[i-1]
		o.ran = true
		o.code = -1
		if e := bytes.LastIndex(body, []byte("\n"+batchMark+" end ")); e >= 0 {
			var idx, code int
			var ns int64
			if _, err := fmt.Sscanf(string(body[e+1+len(batchMark)+len(" end "):]), "%d %d %d", &idx, &code, &ns); err == nil && idx == i {
				o.code, o.duration = code, time.Duration(ns)
			}
			body = body[:e]
		}
		o.stdout = string(body)
	}
	for _, seg := range bytes.Split(stderr, []byte(batchMark+" part ")) {
		nl := bytes.IndexByte(seg, '\n')
		if nl < 0 {
			continue
		}
		if i, err := strconv.Atoi(string(seg[:nl])); err == nil && i >= 1 && i <= n {
			out[i-1].stderr = string(seg[nl+1:])
		}
	}
	return out
}

// statusFile is where a batch records its running part. /run is a tmpfs
// on every guest the steps know; a guest without one only loses the name of
// the step that timed out.
const statusFile = "/run/.vmfork-batch"

// runBatch runs items in the guest as one command and returns each part's
// outcome. A batch that did not finish in time returns the error, with the
// outcomes of the parts that had finished before, as far as the status file
// tells: the part that was running is marked with timedOut.
func runBatch(ctx context.Context, env *Env, items []batchItem) ([]partOutcome, int, error) {
	var budget time.Duration
	firm := false
	for i, it := range items {
		firm = firm || it.step.firm
		if it.last || i == len(items)-1 {
			if it.step.Timeout <= 0 {
				budget = 0
				break
			}
			budget += it.step.Timeout
		}
	}
	bctx, cancel := ctx, context.CancelFunc(func() {})
	var stretch *stretchContext
	if budget > 0 {
		stretch, cancel = withStretch(ctx, budget, env.slow(firm))
		bctx = stretch
	}
	defer cancel()
	status := statusFile
	if env.root != "" {
		status = env.root + statusFile
	}
	script, args, input := buildBatch(items, status)
	genv := append([]string{guestPath, "LC_ALL=C"}, env.scriptEnv...)
	if input != nil {
		genv = append(genv, inputVar+"="+string(input))
	}
	st, err := run(bctx, env.Agent, qmp.ExecRequest{
		Path:          "/bin/sh",
		Args:          append([]string{"-c", script, "sh"}, args...),
		Env:           genv,
		CaptureOutput: true,
	})
	if err != nil {
		running := 1
		if stretch != nil && stretch.Err() == context.DeadlineExceeded && ctx.Err() == nil {
			// Which part was running: the status file, read with the
			// agent's file calls (no process), under a short deadline of
			// its own.
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
			if b, rerr := env.Agent.ReadFile(rctx, status); rerr == nil {
				if i, aerr := strconv.Atoi(strings.TrimSpace(string(b))); aerr == nil && i >= 1 && i <= len(items) {
					running = i
				}
			}
			rcancel()
			err = fmt.Errorf("timed out after %v: %w", items[running-1].step.Timeout*time.Duration(1+stretch.Stretched()), err)
		}
		return nil, running, err
	}
	return parseBatch(len(items), st.Stdout, st.Stderr), 0, nil
}

// exitExplained is what a part exits with when it failed and the last line
// of its stderr says why, and what to do, in words meant for the user: the
// step's error is that line, not a tool's raw output.
const exitExplained = 101

// slot is a step's place in the results while its parts are under way.
type slot struct {
	step    Step
	idx     int // in env.Result.Steps
	parts   int // parts not yet run
	elapsed time.Duration
}

// runParts runs the steps at the start of steps that are batchable (those
// with Parts, and skipped ones in between) and returns how many it took and
// the first failure. Parts are prepared in chain order; they run when a
// step without parts comes, a part needs the link raised or input of its
// own, or the steps end.
func runParts(ctx context.Context, steps []Step, env *Env) (int, error) {
	res := env.Result
	var items, last []batchItem
	var slots, lastSlots []*slot
	var failed error
	flush := func() {
		if len(items) == 0 || failed != nil {
			items, slots = nil, nil
			return
		}
		failed = execBatch(ctx, env, items, slots)
		items, slots = nil, nil
	}
	n := 0
	for ; n < len(steps) && failed == nil; n++ {
		s := steps[n]
		if s.Parts == nil && s.skip == "" {
			break
		}
		res.Steps = append(res.Steps, StepResult{Name: s.Name})
		idx := len(res.Steps) - 1
		if s.Parts == nil {
			res.Steps[idx].Status, res.Steps[idx].Detail = StatusSkipped, s.skip
			continue
		}
		t0 := env.now()
		parts, err := prepare(ctx, s, env)
		// Host-side work (an RSA key, say) is part of the step's time.
		prep := env.now().Sub(t0)
		res.Steps[idx].DurationMS = ms(prep)
		var skip *skipError
		switch {
		case errors.As(err, &skip):
			res.Steps[idx].Status, res.Steps[idx].Detail = StatusSkipped, skip.reason
			continue
		case err == nil && len(parts) == 0:
			res.Steps[idx].Status, res.Steps[idx].Detail = StatusOK, env.detail
			continue
		case err != nil:
			// The steps before still run: they come first.
			res.Steps[idx].Status = StatusNotRun
			flush()
			if failed == nil {
				failed = fmt.Errorf("step %q: %w", s.Name, err)
				res.Steps[idx].Status, res.Steps[idx].Error = StatusFailed, failed.Error()
			}
			n++
			return n, failed
		}
		sl := &slot{step: s, idx: idx, parts: len(parts), elapsed: prep}
		for k, p := range parts {
			if p.LinkUp || (p.Input != nil && hasInput(items)) {
				flush()
				if failed != nil {
					break
				}
			}
			if p.LinkUp && env.Link != nil {
				// Raising the link is the step's time too: a driver
				// waits there for a new tap's bridge port to forward
				// (internal/brport), seconds on a bridge with STP.
				t1 := env.now()
				if err := env.Link.SetLink(ctx, true); err != nil {
					failed = fmt.Errorf("step %q: raise the link: %w", s.Name, err)
					res.Steps[idx].Status, res.Steps[idx].Error = StatusFailed, failed.Error()
					break
				}
				sl.elapsed += env.now().Sub(t1)
			}
			it := batchItem{step: s, part: p, last: k == len(parts)-1}
			if p.Last {
				last, lastSlots = append(last, it), append(lastSlots, sl)
				continue
			}
			items, slots = append(items, it), append(slots, sl)
		}
	}
	if failed == nil {
		items, slots = append(items, last...), append(slots, lastSlots...)
	}
	flush()
	// Steps a failure left unfinished are not_run; the failed one says so.
	for i := range res.Steps {
		if res.Steps[i].Status == "" {
			res.Steps[i].Status = StatusNotRun
		}
	}
	return n, failed
}

func hasInput(items []batchItem) bool {
	for _, it := range items {
		if it.part.Input != nil {
			return true
		}
	}
	return false
}

// prepare runs a step's host side under the step's timeout.
func prepare(ctx context.Context, s Step, env *Env) ([]*Part, error) {
	if s.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.Timeout)
		defer cancel()
	}
	env.detail = ""
	return s.Parts(ctx, env)
}

// execBatch runs items and records each step's outcome in its slot.
func execBatch(ctx context.Context, env *Env, items []batchItem, slots []*slot) error {
	res := env.Result
	t0 := env.now()
	outs, running, err := runBatch(ctx, env, items)
	if err != nil {
		// Parts before the running one finished; the guest did not say
		// what they found.
		for i := 0; i < running-1; i++ {
			sl := slots[i]
			if sl.parts--; sl.parts == 0 {
				res.Steps[sl.idx].Status = StatusOK
			}
		}
		sl := slots[max(running, 1)-1]
		err = fmt.Errorf("step %q: %w", sl.step.Name, err)
		r := &res.Steps[sl.idx]
		r.Status, r.Error, r.DurationMS = StatusFailed, err.Error(), ms(env.now().Sub(t0))
		return err
	}
	for i, it := range items {
		sl, o := slots[i], outs[i]
		r := &res.Steps[sl.idx]
		if !o.ran {
			if r.Status == "" {
				r.Status = StatusNotRun
			}
			continue
		}
		sl.elapsed += o.duration
		r.DurationMS = ms(sl.elapsed)
		out := strings.TrimSuffix(o.stdout, "\n")
		switch o.code {
		case 0:
			env.detail = ""
			if it.part.Done != nil {
				if derr := it.part.Done(env, out); derr != nil {
					derr = fmt.Errorf("step %q: %w", sl.step.Name, derr)
					r.Status, r.Error = StatusFailed, derr.Error()
					return derr
				}
			} else {
				env.detail = strings.TrimSpace(out)
			}
			if env.detail != "" {
				r.Detail = env.detail
			}
			if sl.parts--; sl.parts == 0 {
				r.Status = StatusOK
			}
		case exitNothingToDo:
			r.Status, r.Detail = StatusSkipped, strings.TrimSpace(out)
		default:
			ferr := partError(it.part, o)
			ferr = fmt.Errorf("step %q: %w", sl.step.Name, ferr)
			r.Status, r.Error = StatusFailed, ferr.Error()
			var ee *ExitError
			if errors.As(ferr, &ee) {
				code := ee.Code
				r.ExitCode, r.StderrTail = &code, ee.Stderr
			}
			return ferr
		}
	}
	return nil
}

// partError is the error of a part that did not succeed.
func partError(p *Part, o partOutcome) error {
	if o.code < 0 {
		return fmt.Errorf("the guest's shell ended without finishing (stderr %q)", tail([]byte(o.stderr)))
	}
	if p.Fail != nil {
		return p.Fail(o.code, o.stdout, o.stderr)
	}
	if o.code == exitExplained {
		return errors.New(lastLine(o.stderr))
	}
	return &ExitError{What: "guest script", Code: o.code, Stderr: tail([]byte(o.stderr))}
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
