package customize

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

func noop(name string) Step {
	return Step{Name: name, Fn: func(context.Context, *Env) error { return nil }}
}

func TestChainEditsReturnCopies(t *testing.T) {
	base := NewChain(noop("a.1"), noop("a.2"), noop("a.3"))
	cases := []struct {
		name string
		got  Chain
		want string
	}{
		{"append", base.Append(noop("x.1")), "a.1 a.2 a.3 x.1"},
		{"prepend", base.Prepend(noop("x.1")), "x.1 a.1 a.2 a.3"},
		{"append after", base.AppendAfter("a.1", noop("x.1"), noop("x.2")), "a.1 x.1 x.2 a.2 a.3"},
		{"append after the last", base.AppendAfter("a.3", noop("x.1")), "a.1 a.2 a.3 x.1"},
		{"append after a missing step", base.AppendAfter("nope", noop("x.1")), "a.1 a.2 a.3"},
		{"remove", base.Remove("a.2"), "a.1 a.3"},
		{"remove a missing step", base.Remove("nope"), "a.1 a.2 a.3"},
		{"swap", base.Swap(SkipStep("a.2", "why")), "a.1 a.2 a.3"},
	}
	for _, c := range cases {
		if got := strings.Join(c.got.Names(), " "); got != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
	}
	if got := strings.Join(base.Names(), " "); got != "a.1 a.2 a.3" {
		t.Errorf("base changed to %s by edits", got)
	}
	// Edits of one copy never reach another sharing its array.
	grown := base.Append(noop("x.1"))
	_ = grown.Swap(SkipStep("a.1", "changed"))
	if s, _ := grown.Step("a.1"); s.Timeout != 0 || s.Fn == nil {
		t.Errorf("swap in a copy changed the original")
	}
	timed := base.WithTimeout("a.2", time.Second)
	if s, _ := timed.Step("a.2"); s.Timeout != time.Second {
		t.Errorf("WithTimeout: got %v, want 1s", s.Timeout)
	}
	if s, _ := base.Step("a.2"); s.Timeout != 0 {
		t.Errorf("WithTimeout changed the original: %v", s.Timeout)
	}
}

func TestChainValidate(t *testing.T) {
	for _, c := range []struct {
		chain Chain
		says  string
	}{
		{NewChain(noop("a.1"), noop("a.1")), `"a.1" is in the chain twice`},
		{NewChain(noop("")), "has no name"},
		{NewChain(Step{Name: "a.1"}), "has no function"},
	} {
		if err := c.chain.Validate(); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Validate(%v) = %v, want an error saying %q", c.chain.Names(), err, c.says)
		}
	}
}

func TestRunReportsEveryStep(t *testing.T) {
	fail := Step{Name: "t.fail", Fn: func(context.Context, *Env) error {
		return &ExitError{What: `hook "50-fail"`, Code: 3, Stderr: "boom"}
	}}
	detail := Step{Name: "t.detail", Fn: func(_ context.Context, env *Env) error {
		env.Detailf("did %d things", 2)
		return nil
	}}
	c := NewChain(detail, SkipStep("t.skip", "not here"), fail, noop("t.after"))
	res, err := Run(t.Context(), c, &Env{Child: Child{Mode: ModeFresh, VMGenID: "g"}})
	if err == nil || err.Error() != `step "t.fail": hook "50-fail" exited with code 3: stderr "boom"` {
		t.Fatalf("Run error = %v", err)
	}
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 3 {
		t.Errorf("error does not carry the exit code: %v", err)
	}
	want := []struct {
		name   string
		status Status
		detail string
	}{
		{"t.detail", StatusOK, "did 2 things"},
		{"t.skip", StatusSkipped, "not here"},
		{"t.fail", StatusFailed, ""},
		{"t.after", StatusNotRun, ""},
	}
	if len(res.Steps) != len(want) {
		t.Fatalf("steps = %+v", res.Steps)
	}
	for i, w := range want {
		s := res.Steps[i]
		if s.Name != w.name || s.Status != w.status || s.Detail != w.detail {
			t.Errorf("step %d = %+v, want %s %s %q", i, s, w.name, w.status, w.detail)
		}
	}
	f := res.Steps[2]
	if f.ExitCode == nil || *f.ExitCode != 3 || f.StderrTail != "boom" || !strings.Contains(f.Error, "exited with code 3") {
		t.Errorf("failed step = %+v, want exit code 3 and stderr tail boom", f)
	}
	if res.Mode != ModeFresh || res.VMGenID != "g" {
		t.Errorf("result mode %q vmgenid %q", res.Mode, res.VMGenID)
	}
}

// A step that runs out of time fails within its timeout and says so, and
// the rest of the chain does not run.
func TestRunStepTimeout(t *testing.T) {
	a := newFakeAgent()
	a.hang = true
	c := NewChain(AgentStep(), HostnameStep("x")).WithTimeout(StepAgent, 100*time.Millisecond)
	start := time.Now()
	res, err := Run(t.Context(), c, &Env{Agent: a})
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Run took %v with a 100ms step timeout", d)
	}
	if err == nil || !strings.Contains(err.Error(), `step "vmfork.agent": timed out after 100ms: guest agent does not answer`) {
		t.Fatalf("Run error = %v", err)
	}
	if res.Steps[1].Status != StatusNotRun {
		t.Errorf("step after the timeout: %+v", res.Steps[1])
	}
}

func TestLazyAgent(t *testing.T) {
	dials := 0
	var fail error = errors.New("connection refused")
	inner := newFakeAgent()
	l := NewLazyAgent(func(context.Context) (Agent, error) {
		dials++
		if fail != nil {
			return nil, fail
		}
		return inner, nil
	})
	err := l.Ping(t.Context())
	if !errors.Is(err, ErrNoAgent) || err.Error() != "connection refused" {
		t.Fatalf("Ping with no agent = %v, want ErrNoAgent with the dial error", err)
	}
	fail = nil
	for range 3 {
		if err := l.Ping(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if dials != 2 {
		t.Errorf("dialled %d times, want once more after the failure and then never", dials)
	}
	// The dial's answer is the first Ping's: only the two after it ask.
	if got := strings.Join(inner.calls, " "); got != "ping ping" {
		t.Errorf("agent calls = %q, want two pings (the dial answered the first)", got)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestTail(t *testing.T) {
	if got := tail([]byte("  short\n")); got != "short" {
		t.Errorf("tail = %q", got)
	}
	long := strings.Repeat("line of noise\n", 100) + "the error at the end\n"
	got := tail([]byte(long))
	if len(got) > stderrTail+3 || !strings.HasPrefix(got, "...") || !strings.HasSuffix(got, "the error at the end") {
		t.Errorf("tail of a long stderr = %q", got)
	}
	if strings.HasPrefix(got, "...ine") {
		t.Errorf("tail does not start on a line boundary: %q", got)
	}
}

func TestExitErrorSignal(t *testing.T) {
	err := exitErr("hook \"x\"", qmp.ExecStatus{Exited: true, Signal: 9})
	if err == nil || err.Error() != `hook "x" was killed by signal 9` {
		t.Errorf("got %v", err)
	}
}
