package vmfork

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/qmp"
)

// Running an explore's tries: each in its branch through the guest agent,
// with the watched files listed before and after and the score taken after.

// runTries runs every try in its branch, parallel at once.
func (mg *Manager) runTries(ctx context.Context, req ExploreRequest, names []string, fr *ForkResult) []TryResult {
	failed := map[string]string{}
	for _, f := range fr.Failed {
		failed[f.Name] = f.Error
	}
	out := make([]TryResult, len(req.Tries))
	sem := make(chan struct{}, req.Parallel)
	var wg sync.WaitGroup
	for i, cmd := range req.Tries {
		out[i] = TryResult{Index: i + 1, Command: cmd, Branch: names[i], ExitCode: -1}
		if e, ok := failed[names[i]]; ok {
			out[i].Error = "branch did not come up: " + e
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			mg.runTry(ctx, req, &out[i])
		}()
	}
	wg.Wait()
	return out
}

// runTry runs one try in its branch and fills r.
func (mg *Manager) runTry(ctx context.Context, req ExploreRequest, r *TryResult) {
	log := mg.Log.WithFields(logrus.Fields{"machine": r.Branch, "try": r.Index})
	m, err := mg.Store.LoadMachine(r.Branch)
	if err != nil {
		r.Error = err.Error()
		return
	}
	agent, err := mg.Driver.Agent(ctx, m)
	if err != nil {
		r.Error = fmt.Sprintf("agent: %v", err)
		return
	}
	defer agent.Close()
	var before map[string]string
	if len(req.Watch) > 0 {
		if before, err = snapshotFiles(ctx, agent, req.Watch, req.TryTimeout); err != nil {
			r.Error = fmt.Sprintf("watch before the try: %v", err)
			return
		}
	}
	tctx, cancel := context.WithTimeout(ctx, req.TryTimeout)
	start := time.Now()
	st, err := agent.Run(tctx, shellRequest(r.Command))
	r.DurationMS = ms(time.Since(start))
	timedOut := errors.Is(tctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
	cancel()
	r.Stdout, r.Stderr = tail(st.Stdout, req.TailBytes), tail(st.Stderr, req.TailBytes)
	switch {
	case timedOut:
		// The command runs on in the guest; its branch is a loser and goes.
		r.TimedOut = true
		log.Info("try timed out")
		return
	case err != nil:
		r.Error = err.Error()
		return
	}
	r.ExitCode = exitCode(st)
	log.WithFields(logrus.Fields{"exit_code": r.ExitCode, "elapsed": time.Duration(r.DurationMS * 1e6).Round(time.Millisecond)}).Info("try done")
	if len(req.Watch) > 0 {
		after, err := snapshotFiles(ctx, agent, req.Watch, req.TryTimeout)
		if err != nil {
			r.Error = fmt.Sprintf("watch after the try: %v", err)
			return
		}
		r.Changed = diffFiles(before, after)
		if r.ChangedCount = len(r.Changed); r.ChangedCount > maxChanged {
			r.Changed = r.Changed[:maxChanged]
		}
	}
	if req.Score != "" {
		sctx, cancel := context.WithTimeout(ctx, req.TryTimeout)
		defer cancel()
		st, err := agent.Run(sctx, shellRequest(req.Score))
		if err != nil {
			r.Error = fmt.Sprintf("score: %v", err)
			return
		}
		s, err := parseScore(st)
		if err != nil {
			r.Error = fmt.Sprintf("score: %v", err)
			return
		}
		r.Score = &s
	}
}

func shellRequest(cmd string) qmp.ExecRequest {
	return qmp.ExecRequest{Path: "/bin/sh", Args: []string{"-c", cmd}, CaptureOutput: true}
}

// exitCode follows the shell: a command killed by signal N exits 128+N.
func exitCode(st qmp.ExecStatus) int {
	if st.Signal > 0 {
		return 128 + st.Signal
	}
	return st.ExitCode
}

// tail returns the last n bytes of b as valid UTF-8.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.ToValidUTF8(string(b), "")
}

// parseScore reads the last non-empty line of a score command's stdout as
// a number. A score command that fails scores nothing.
func parseScore(st qmp.ExecStatus) (float64, error) {
	if c := exitCode(st); c != 0 {
		return 0, fmt.Errorf("score command exited %d: %s", c, tail(bytes.TrimSpace(st.Stderr), 200))
	}
	lines := strings.Split(strings.TrimSpace(string(st.Stdout)), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	f, err := strconv.ParseFloat(last, 64)
	if err != nil {
		return 0, fmt.Errorf("score command printed %q, not a number", tail([]byte(last), 80))
	}
	return f, nil
}

// pickWinner returns the index of the winning try, or -1. A try that timed
// out or has an error never wins. Without a score command a try that
// exited 0 wins, the fastest first; with one the highest score wins, then
// a try that exited 0, then the fastest.
func pickWinner(tries []TryResult, scored bool) int {
	best := -1
	better := func(a, b TryResult) bool {
		if scored && *a.Score != *b.Score {
			return *a.Score > *b.Score
		}
		if (a.ExitCode == 0) != (b.ExitCode == 0) {
			return a.ExitCode == 0
		}
		return a.DurationMS < b.DurationMS
	}
	for i, t := range tries {
		if t.Error != "" || t.TimedOut || (scored && t.Score == nil) || (!scored && t.ExitCode != 0) {
			continue
		}
		if best < 0 || better(t, tries[best]) {
			best = i
		}
	}
	return best
}

// snapshotScript lists every regular file under the paths given as its
// arguments with an MD5 of its content, which finds changes that keep a
// file's size and fall within its mtime's granularity. Paths that do not
// exist list nothing.
const snapshotScript = `for p in "$@"; do [ -e "$p" ] && find "$p" -type f -exec md5sum {} + ; done 2>/dev/null; exit 0`

// snapshotFiles maps each file under paths to its content hash.
func snapshotFiles(ctx context.Context, agent *qmp.Agent, paths []string, timeout time.Duration) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := agent.Run(ctx, qmp.ExecRequest{
		Path: "/bin/sh", Args: append([]string{"-c", snapshotScript, "sh"}, paths...), CaptureOutput: true,
	})
	if err != nil {
		return nil, err
	}
	if st.OutTruncated {
		return nil, fmt.Errorf("the file list under %s is over the agent's output limit", strings.Join(paths, " "))
	}
	return parseSnapshot(st.Stdout), nil
}

// parseSnapshot reads md5sum lines: "HASH  PATH".
func parseSnapshot(out []byte) map[string]string {
	files := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		sum, path, ok := strings.Cut(line, "  ")
		if ok && path != "" {
			files[path] = sum
		}
	}
	return files
}

// diffFiles lists the files added (A), modified (M) and deleted (D)
// between two snapshots, sorted by path.
func diffFiles(before, after map[string]string) []string {
	var out []string
	for p, sum := range after {
		switch old, ok := before[p]; {
		case !ok:
			out = append(out, "A "+p)
		case old != sum:
			out = append(out, "M "+p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			out = append(out, "D "+p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][2:] < out[j][2:] })
	return out
}
