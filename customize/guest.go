package customize

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// guestPath is the PATH of everything the steps run: qemu-ga 7.2 replaces a
// command's environment with the one given, so without it nothing is found.
const guestPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// exitNothingToDo is what a step's guest script exits with to say the step
// has nothing to do here; its stdout says why.
const exitNothingToDo = 100

// stderrTail is how much of a failed command's stderr a result keeps.
const stderrTail = 512

// shell runs script with /bin/sh -c in the guest, with args as $1, $2, ...,
// and returns its stdout. what names it in errors. Exit 100 becomes
// Skipped(stdout); any other non-zero exit an *ExitError.
func shell(ctx context.Context, a Agent, what, script string, args ...string) (string, error) {
	st, err := run(ctx, a, qmp.ExecRequest{
		Path:          "/bin/sh",
		Args:          append([]string{"-c", script, "sh"}, args...),
		Env:           []string{guestPath, "LC_ALL=C"},
		CaptureOutput: true,
	})
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	out := string(st.Stdout)
	if st.Signal == 0 && st.ExitCode == exitNothingToDo {
		return "", Skipped(strings.TrimSpace(out))
	}
	if err := exitErr(what, st); err != nil {
		return out, err
	}
	return out, nil
}

// exitErr returns an *ExitError for a command that did not exit 0.
func exitErr(what string, st qmp.ExecStatus) error {
	if st.Signal == 0 && st.ExitCode == 0 {
		return nil
	}
	code := st.ExitCode
	if st.Signal != 0 {
		code = -1
	}
	return &ExitError{What: what, Code: code, Signal: st.Signal, Stderr: tail(st.Stderr)}
}

// tail returns the end of a command's output, trimmed, at most stderrTail
// bytes, starting on a line boundary when it can.
func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) <= stderrTail {
		return s
	}
	s = s[len(s)-stderrTail:]
	if i := strings.IndexByte(s, '\n'); i >= 0 && i < len(s)-1 {
		s = s[i+1:]
	}
	return "..." + s
}

// ErrNoAgent is wrapped by the errors of a LazyAgent that could not
// connect: the guest agent does not answer at all, as opposed to a command
// that failed.
var ErrNoAgent = errors.New("no guest agent")

// ErrMachineGone is wrapped by a dial error when the machine's process has
// exited: no wait for its agent can succeed, so none is made.
var ErrMachineGone = errors.New("machine is gone")

type noAgentError struct{ err error }

func (e noAgentError) Error() string   { return e.err.Error() }
func (e noAgentError) Unwrap() []error { return []error{e.err, ErrNoAgent} }

// Polling of a guest command's status. The steps' commands take 10 to
// 200 ms in a fresh child under TCG, and the time from a command's exit to
// the poll that sees it is time the child waits for nothing: about half the
// last interval. A poll costs the guest well under a millisecond, so polls
// start often, back off gently and stay frequent. Measured on the test
// guest (TCG, one child at a time, medians of 10): 5 ms growing by 1.5 to
// 50 ms gave a 258 ms network step and a 564 ms chain; these values 221 ms
// and 530 ms.
const (
	pollMin    = 2 * time.Millisecond
	pollMax    = 15 * time.Millisecond
	pollGrowth = 1.25
)

// run starts req in the guest and polls until it exits. A non-zero exit is
// not an error here; the caller judges it. If ctx ends first the command
// keeps running in the guest.
func run(ctx context.Context, a Agent, req qmp.ExecRequest) (qmp.ExecStatus, error) {
	pid, err := a.Exec(ctx, req)
	if err != nil {
		return qmp.ExecStatus{}, err
	}
	timer := time.NewTimer(pollMin)
	defer timer.Stop()
	for delay := pollMin; ; delay = min(time.Duration(float64(delay)*pollGrowth), pollMax) {
		select {
		case <-timer.C:
		case <-ctx.Done():
			return qmp.ExecStatus{}, fmt.Errorf("%s (pid %d) still runs: %w", req.Path, pid, ctx.Err())
		}
		st, err := a.ExecStatus(ctx, pid)
		if err != nil || st.Exited {
			return st, err
		}
		timer.Reset(delay)
	}
}

// LazyAgent is an Agent that connects on first use, under the context of
// the call that needs it, and again after a failed attempt. A chain can
// then start before the guest agent answers, and waiting for it is a step
// with a timeout of its own (vmfork.agent).
type LazyAgent struct {
	dial func(ctx context.Context) (Agent, error)

	mu sync.Mutex
	a  Agent
}

var _ Agent = (*LazyAgent)(nil)

// NewLazyAgent returns a LazyAgent that connects with dial.
func NewLazyAgent(dial func(ctx context.Context) (Agent, error)) *LazyAgent {
	return &LazyAgent{dial: dial}
}

func (l *LazyAgent) get(ctx context.Context) (Agent, error) {
	a, _, err := l.connect(ctx)
	return a, err
}

// connect returns the agent, and whether it was dialled just now.
func (l *LazyAgent) connect(ctx context.Context) (Agent, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.a != nil {
		return l.a, false, nil
	}
	a, err := l.dial(ctx)
	if err != nil {
		return nil, false, noAgentError{err}
	}
	l.a = a
	return a, true, nil
}

// Close closes the connection if there is one.
func (l *LazyAgent) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.a.(io.Closer); ok {
		l.a = nil
		return c.Close()
	}
	return nil
}

// Ping implements Agent. The dial returns once the agent has answered (a
// driver's Agent does: a sync or a ping), so a Ping that dialled sends
// nothing more: in a fresh child under TCG a round trip is 10-25 ms.
func (l *LazyAgent) Ping(ctx context.Context) error {
	a, dialled, err := l.connect(ctx)
	if err != nil || dialled {
		return err
	}
	return a.Ping(ctx)
}

// Exec implements Agent.
func (l *LazyAgent) Exec(ctx context.Context, req qmp.ExecRequest) (int, error) {
	a, err := l.get(ctx)
	if err != nil {
		return 0, err
	}
	return a.Exec(ctx, req)
}

// ExecStatus implements Agent.
func (l *LazyAgent) ExecStatus(ctx context.Context, pid int) (qmp.ExecStatus, error) {
	a, err := l.get(ctx)
	if err != nil {
		return qmp.ExecStatus{}, err
	}
	return a.ExecStatus(ctx, pid)
}

// GetTime implements Agent.
func (l *LazyAgent) GetTime(ctx context.Context) (time.Time, error) {
	a, err := l.get(ctx)
	if err != nil {
		return time.Time{}, err
	}
	return a.GetTime(ctx)
}

// SetTime implements Agent.
func (l *LazyAgent) SetTime(ctx context.Context, t *time.Time) error {
	a, err := l.get(ctx)
	if err != nil {
		return err
	}
	return a.SetTime(ctx, t)
}

// WriteFile implements Agent.
func (l *LazyAgent) WriteFile(ctx context.Context, path string, data []byte) error {
	a, err := l.get(ctx)
	if err != nil {
		return err
	}
	return a.WriteFile(ctx, path, data)
}

// ReadFile implements Agent.
func (l *LazyAgent) ReadFile(ctx context.Context, path string) ([]byte, error) {
	a, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return a.ReadFile(ctx, path)
}

// NetworkInterfaces implements Agent.
func (l *LazyAgent) NetworkInterfaces(ctx context.Context) ([]qmp.NetworkInterface, error) {
	a, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return a.NetworkInterfaces(ctx)
}

// waitAgent pings until the agent answers or ctx ends. Each attempt is
// short: a request written before the guest's agent opened its port can be
// lost, and only a new one is answered.
func waitAgent(ctx context.Context, a Agent) error {
	const attempt = 3 * time.Second
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		err := a.Ping(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || errors.Is(err, ErrMachineGone) {
			return fmt.Errorf("guest agent does not answer: %w", err)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			// Not a timeout: the connection failed; don't spin on it.
			select {
			case <-ctx.Done():
				return fmt.Errorf("guest agent does not answer: %w", err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}
