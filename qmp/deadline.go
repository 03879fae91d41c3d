package qmp

import (
	"context"
	"time"
)

// withDeadline runs fn, an I/O call on a connection, so that it returns when ctx ends: when ctx is
// done it sets the deadline through setDeadline to now, which fails the blocked read or write.
// Afterwards the deadline is cleared again, so a later call is not hit by it. It returns ctx.Err()
// when the context cut fn short, so callers can test for context.DeadlineExceeded.
func withDeadline(ctx context.Context, setDeadline func(time.Time) error, fn func() error) error {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = setDeadline(time.Now()) // the connection may already be closed; fn reports that
		close(fired)
	})
	err := fn()
	if !stop() {
		<-fired
		_ = setDeadline(time.Time{})
		if err != nil {
			return ctx.Err()
		}
	}
	return err
}
