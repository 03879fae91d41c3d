package customize

import (
	"context"
	"sync"
	"time"
)

// A step's timeout says how long a guest that does not answer takes to find
// out. On a host whose CPUs are saturated (a burst of children under TCG), a
// guest that answers late is slow, not dead: its time is stretched, a
// period at a time, while Env.Slow says so (issue 29 lost a child whose
// agent was merely late).

// MaxStretch is how many times a step's timeout is renewed for a slow guest:
// a step of 10 s ends after at most 60 s.
const MaxStretch = 5

// stretchContext is a context whose deadline moves: when its period ends
// and slow says the guest still makes progress, another period begins.
type stretchContext struct {
	context.Context // the parent: values
	done            chan struct{}
	stop            chan struct{}
	stopOnce        sync.Once

	mu        sync.Mutex
	err       error
	deadline  time.Time
	stretched int
}

// withStretch returns ctx limited to period, renewed up to MaxStretch times
// while slow() is true (nil: never, like context.WithTimeout).
func withStretch(ctx context.Context, period time.Duration, slow func() bool) (*stretchContext, context.CancelFunc) {
	c := &stretchContext{Context: ctx, done: make(chan struct{}), stop: make(chan struct{}), deadline: time.Now().Add(period)}
	if dl, ok := ctx.Deadline(); ok && dl.Before(c.deadline) {
		c.deadline = dl
	}
	end := func(err error) {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(c.done)
	}
	go func() {
		t := time.NewTimer(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				end(ctx.Err())
				return
			case <-c.stop:
				end(context.Canceled)
				return
			case <-t.C:
				c.mu.Lock()
				more := c.stretched < MaxStretch && slow != nil && slow()
				if more {
					c.stretched++
					c.deadline = time.Now().Add(period)
					if dl, ok := ctx.Deadline(); ok && dl.Before(c.deadline) {
						c.deadline = dl
					}
				}
				c.mu.Unlock()
				if !more {
					end(context.DeadlineExceeded)
					return
				}
				t.Reset(period)
			}
		}
	}()
	return c, func() { c.stopOnce.Do(func() { close(c.stop) }) }
}

func (c *stretchContext) Done() <-chan struct{} { return c.done }

func (c *stretchContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Deadline is the end of the current period: a step that sizes a guest
// wait by it (DHCP) waits a period.
func (c *stretchContext) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, true
}

// timedOut says whether the context ended by its own deadline, and after
// how long in all. A nil c (a step without a timeout) never times out.
func (c *stretchContext) timedOut(period time.Duration) (bool, time.Duration) {
	if c == nil {
		return false, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == context.DeadlineExceeded, period * time.Duration(1+c.stretched)
}

// Stretched returns how many periods were added (none to a nil c).
func (c *stretchContext) Stretched() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stretched
}
