package qmp

import (
	"context"
	"io"
	"time"

	"github.com/sirupsen/logrus"
)

// Option configures a Monitor or an Agent.
type Option func(*options)

type options struct {
	log         *logrus.Entry
	callTimeout time.Duration
}

// DefaultCallTimeout bounds one command, or one Dial, whose context has no
// deadline of its own: a wedged QEMU or guest agent then fails the call
// instead of hanging the command forever. Every QMP and agent command
// vmfork sends answers in well under a second, even under TCG on a loaded
// host; long operations (migration, block jobs) are asynchronous and their
// waits poll with calls of their own.
const DefaultCallTimeout = time.Minute

// WithCallTimeout sets the bound for calls whose context has no deadline
// (DefaultCallTimeout otherwise); zero or less leaves such calls unbounded.
func WithCallTimeout(d time.Duration) Option {
	return func(o *options) { o.callTimeout = d }
}

// WithLogger makes the client log each command's name and id at debug level, and dropped replies
// and discarded agent output. Without it the client logs nothing; it never uses logrus's global
// logger, so the caller chooses fields and sinks.
func WithLogger(log *logrus.Entry) Option {
	return func(o *options) { o.log = log }
}

func buildOptions(opts []Option) options {
	o := options{callTimeout: DefaultCallTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		l.SetLevel(logrus.PanicLevel)
		o.log = logrus.NewEntry(l)
	}
	return o
}

// bound returns ctx limited to d when it has no deadline of its own.
func bound(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}
