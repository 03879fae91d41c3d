package customize

import (
	"context"
	"testing"
	"time"
)

// TestLinkUpTimeIsTheSteps: the time the host takes to raise the link (a
// driver waits there for a new tap's bridge port to forward) counts in the
// step whose part needs the link, not in the chain's overhead.
func TestLinkUpTimeIsTheSteps(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		env := g.env(sh, &hostAgent{})
		env.Link = LinkFunc(func(context.Context, bool) error {
			time.Sleep(300 * time.Millisecond)
			return nil
		})
		step := Step{Name: "test.link", Parts: func(context.Context, *Env) ([]*Part, error) {
			return []*Part{{Script: "echo up", LinkUp: true}}, nil
		}}
		res, err := Run(t.Context(), NewChain(step), env)
		if err != nil {
			t.Fatal(err)
		}
		if d := res.Steps[0].DurationMS; d < 300 {
			t.Errorf("step %+v: %.1f ms, want the link's 300 ms in it", res.Steps[0], d)
		}
		if res.OverheadMS >= 300 {
			t.Errorf("overhead %.1f ms: the link's wait counted outside the step", res.OverheadMS)
		}
	})
}
