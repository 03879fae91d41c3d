package qmp

import (
	"io"

	"github.com/sirupsen/logrus"
)

// Option configures a Monitor or an Agent.
type Option func(*options)

type options struct {
	log *logrus.Entry
}

// WithLogger makes the client log each command's name and id at debug level, and dropped replies
// and discarded agent output. Without it the client logs nothing; it never uses logrus's global
// logger, so the caller chooses fields and sinks.
func WithLogger(log *logrus.Entry) Option {
	return func(o *options) { o.log = log }
}

func buildOptions(opts []Option) options {
	var o options
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
