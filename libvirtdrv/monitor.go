//go:build cgo

package libvirtdrv

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/vmfork/vmfork/qmp"
)

// virError gives a libvirt error libvirt's own one-line message and keeps its
// code for errors.Is(err, libvirt.ERR_NO_DOMAIN) and the like.
type virError struct{ e libvirt.Error }

func (v virError) Error() string {
	if note := hung.Load(); note != nil { // keepalive closed the connection
		return *note + ": " + v.e.Message
	}
	return v.e.Message
}
func (v virError) Unwrap() error { return v.e }

func wrap(err error) error {
	var le libvirt.Error
	if errors.As(err, &le) {
		return virError{le}
	}
	return err
}

// call runs f, a libvirt call that takes no context, and returns when it does
// or when ctx ends, whichever is first. libvirt has no way to cancel most
// calls; an abandoned one finishes on its own (the domain reference it uses
// is its own, so it outlives the caller's), and its result is dropped.
func call[T any](ctx context.Context, dom *libvirt.Domain, f func(*libvirt.Domain) (T, error)) (T, error) {
	if err := dom.Ref(); err != nil {
		var zero T
		return zero, wrap(err)
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer dom.Free()
		v, err := f(dom)
		done <- result{v, wrap(err)}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// monitor is QMP through libvirt's passthrough
// (virDomainQemuMonitorCommand[WithFiles]), a qmp.Executor. libvirt owns the
// QMP socket, so every command vmfork needs beyond libvirt's API goes this
// way; libvirt marks the domain tainted (custom-monitor), which changes
// nothing else.
type monitor struct {
	dom *libvirt.Domain
	log *logrus.Entry
}

var _ qmp.Executor = monitor{}

// Execute implements qmp.Executor. A QMP error comes back inside libvirt's
// reply string, not as a libvirt error (src/qemu/qemu_monitor_json.c); it is
// returned as a *qmp.Error, like the embedded driver's monitor does.
func (m monitor) Execute(ctx context.Context, cmd string, args, result any) error {
	return m.command(ctx, cmd, args, nil, result)
}

// ExecuteWithFile implements qmp.Executor (libvirt ≥ 8.2 passes at most one
// file per command).
func (m monitor) ExecuteWithFile(ctx context.Context, cmd string, args any, f *os.File, result any) error {
	if f == nil {
		return fmt.Errorf("qmp: %s: no file to pass", cmd)
	}
	return m.command(ctx, cmd, args, f, result)
}

func (m monitor) command(ctx context.Context, cmd string, args any, f *os.File, result any) error {
	req, err := qmp.EncodeCommand(cmd, args)
	if err != nil {
		return err
	}
	m.log.WithField("qmp_cmd", cmd).Debug("qmp command through libvirt")
	reply, err := call(ctx, m.dom, func(d *libvirt.Domain) (string, error) {
		if f == nil {
			return d.QemuMonitorCommand(string(req), libvirt.DOMAIN_QEMU_MONITOR_COMMAND_DEFAULT)
		}
		s, _, err := d.QemuMonitorCommandWithFiles(string(req), []os.File{*f}, libvirt.DOMAIN_QEMU_MONITOR_COMMAND_DEFAULT)
		return s, err
	})
	if err != nil {
		return fmt.Errorf("qmp: %s: %w", cmd, err)
	}
	return qmp.DecodeReply(cmd, []byte(reply), result)
}

// agentTransport carries guest-agent requests over virDomainQemuAgentCommand,
// which returns the same reply objects as the agent's socket: qmp.Agent runs
// unchanged on top of it. It holds its own domain reference until Close.
type agentTransport struct {
	dom  *libvirt.Domain
	once sync.Once
	err  error
}

var _ qmp.Transport = (*agentTransport)(nil)

// Command implements qmp.Transport. libvirt waits for an agent reply with a
// timeout in whole seconds, taken from ctx's deadline (at least 1 s), or its
// default (5 s) without one; the agent's error replies become libvirt errors.
func (t *agentTransport) Command(ctx context.Context, req []byte) ([]byte, error) {
	timeout := libvirt.DOMAIN_QEMU_AGENT_COMMAND_DEFAULT
	if dl, ok := ctx.Deadline(); ok {
		timeout = libvirt.DomainQemuAgentCommandTimeout(max(1, int(math.Ceil(time.Until(dl).Seconds()))))
	}
	reply, err := call(ctx, t.dom, func(d *libvirt.Domain) (string, error) {
		return d.QemuAgentCommand(string(req), timeout, 0)
	})
	if err != nil {
		return nil, err
	}
	return []byte(reply), nil
}

// Close implements qmp.Transport. Idempotent.
func (t *agentTransport) Close() error {
	t.once.Do(func() { t.err = wrap(t.dom.Free()) })
	return t.err
}
