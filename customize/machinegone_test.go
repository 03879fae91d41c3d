package customize

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// A machine whose process has exited fails the agent step at once, not at
// the step's timeout.
func TestAgentStepMachineGone(t *testing.T) {
	gone := NewLazyAgent(func(context.Context) (Agent, error) {
		return nil, fmt.Errorf("machine %q: not running: %w", "c", ErrMachineGone)
	})
	c := NewChain(AgentStep()).WithTimeout(StepAgent, 30*time.Second)
	start := time.Now()
	_, err := Run(t.Context(), c, &Env{Agent: gone})
	if !errors.Is(err, ErrMachineGone) {
		t.Fatalf("Run error = %v, want ErrMachineGone", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Run took %v for a machine that is gone, want at once", d)
	}
}
