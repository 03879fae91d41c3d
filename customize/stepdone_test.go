package customize

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// StepDone hears of every step once, in order, as it ends: the failed one
// and those not run after it too.
func TestRunStepDone(t *testing.T) {
	fail := Step{Name: "t.fail", Fn: func(context.Context, *Env) error { return errors.New("boom") }}
	c := NewChain(noop("t.a"), SkipStep("t.b", "why"), fail, noop("t.d"))
	var seen []string
	env := &Env{StepDone: func(r StepResult) { seen = append(seen, r.Name+"="+string(r.Status)) }}
	if _, err := Run(t.Context(), c, env); err == nil {
		t.Fatal("Run: got nil error, want the failed step's")
	}
	want := "t.a=ok t.b=skipped t.fail=failed t.d=not_run"
	if got := strings.Join(seen, " "); got != want {
		t.Errorf("StepDone saw %q, want %q", got, want)
	}
}
