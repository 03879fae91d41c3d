package qemustate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/qmp"
)

// Migration commands (QEMU 7.2, qapi/migration.json). Only the sequences of this package send them.
const (
	CmdQueryMigrate           = "query-migrate"
	CmdMigrateSetCapabilities = "migrate-set-capabilities"
	CmdMigrate                = "migrate"
	CmdMigrateIncoming        = "migrate-incoming"
	CmdMigrateCancel          = "migrate_cancel"
)

// ErrMigrationFailed is wrapped by WaitMigration's error when the migration ends in "failed" or
// "cancelled".
var ErrMigrationFailed = errors.New("migration failed")

// Migration capabilities vmfork sets (qapi/migration.json, MigrationCapability).
const (
	// CapXIgnoreShared skips RAM blocks backed by a shared file; the fork copies that file
	// instead. It must be set on both ends: a destination without it fails the load and exits.
	CapXIgnoreShared = "x-ignore-shared"
	// CapEvents makes QEMU send MIGRATION events for every state change, not only incoming setup.
	CapEvents = "events"
	// CapBackgroundSnapshot (QEMU 6.0+) saves RAM while the guest runs, write-protecting pages.
	CapBackgroundSnapshot = "background-snapshot"
)

// Migration states reported by query-migrate (qapi/migration.json, MigrationStatus). Completed,
// Failed and Cancelled are terminal.
const (
	MigrationNone       = "none"
	MigrationSetup      = "setup"
	MigrationActive     = "active"
	MigrationDevice     = "device"
	MigrationCancelling = "cancelling"
	MigrationCompleted  = "completed"
	MigrationFailed     = "failed"
	MigrationCancelled  = "cancelled"
)

// Capability is one entry of migrate-set-capabilities.
type Capability struct {
	Name  string `json:"capability"` // one of the Cap constants
	State bool   `json:"state"`
}

// MigrationInfo is the reply of query-migrate. Members QEMU omits in a state stay zero.
type MigrationInfo struct {
	Status           string       `json:"status"`            // one of the Migration constants
	TotalTime        int64        `json:"total-time"`        // milliseconds, so far while active
	Downtime         int64        `json:"downtime"`          // milliseconds, once completed
	ExpectedDowntime int64        `json:"expected-downtime"` // milliseconds, while active
	SetupTime        int64        `json:"setup-time"`        // milliseconds
	RAM              MigrationRAM `json:"ram"`
	ErrorDesc        string       `json:"error-desc"`      // why it failed, when Status is "failed"
	BlockedReasons   []string     `json:"blocked-reasons"` // QEMU 6.0+: what forbids migrating now
}

// MigrationRAM holds the RAM counters of query-migrate. With x-ignore-shared, shared RAM is not
// counted, so Transferred stays small for a fork.
type MigrationRAM struct {
	Transferred int64   `json:"transferred"` // bytes
	Remaining   int64   `json:"remaining"`   // bytes
	Total       int64   `json:"total"`       // bytes
	Duplicate   int64   `json:"duplicate"`   // zero pages
	Normal      int64   `json:"normal"`      // pages sent in full
	NormalBytes int64   `json:"normal-bytes"`
	MBps        float64 `json:"mbps"`
}

// setCapabilities sets migration capabilities. They must be set before migrate or
// migrate-incoming, identically on both ends.
func setCapabilities(ctx context.Context, ex qmp.Executor, caps []Capability) error {
	args := struct {
		Capabilities []Capability `json:"capabilities"`
	}{caps}
	return ex.Execute(ctx, CmdMigrateSetCapabilities, args, nil)
}

// migrate runs cmd, migrate or migrate-incoming, with uri, and returns once the migration has
// started; WaitMigration waits for the end. QEMU 7.2 takes tcp:, unix:, vsock:, rdma:, exec: and
// fd: URIs but not file: (QEMU 8.2). exec: runs /bin/sh -c and dies under libvirt's seccomp; this
// package uses fd: with qmp.GetFD. A failed incoming load makes that QEMU exit, which
// WaitMigration reports as qmp.ErrClosed.
func migrate(ctx context.Context, ex qmp.Executor, cmd, uri string) error {
	return ex.Execute(ctx, cmd, map[string]string{"uri": uri}, nil)
}

// queryMigrate reports the state of the current or last migration.
func queryMigrate(ctx context.Context, ex qmp.Executor) (MigrationInfo, error) {
	var info MigrationInfo
	err := ex.Execute(ctx, CmdQueryMigrate, nil, &info)
	return info, err
}

// WaitMigration polls query-migrate every poll until the migration reaches a terminal state, and
// returns the last MigrationInfo in every case. "completed" returns a nil error; "failed" and
// "cancelled" return an error wrapping ErrMigrationFailed with QEMU's error-desc; ctx ending
// returns ctx.Err() wrapped with the last state. On a *qmp.Monitor, QEMU exiting mid-wait (a
// failed incoming load does that) returns an error wrapping qmp.ErrClosed as soon as the socket
// closes, not at the next tick. log, when not nil, gets each state change at debug level.
//
// Call it after migrate or migrate-incoming has returned: before that the state is "none", which
// is not treated as terminal because an incoming QEMU reports it until the stream starts.
func WaitMigration(ctx context.Context, ex qmp.Executor, poll time.Duration, log *logrus.Entry) (MigrationInfo, error) {
	log = orDiscard(log)
	// An Executor that knows when its connection ends (a *qmp.Monitor) ends the wait at once; for
	// another, a QEMU that exits fails the next query-migrate.
	var done <-chan struct{}
	connErr := func() error { return qmp.ErrClosed }
	if c, ok := ex.(interface {
		Done() <-chan struct{}
		Err() error
	}); ok {
		done, connErr = c.Done(), c.Err
	}
	start := time.Now()
	ticker := time.NewTicker(poll)
	defer ticker.Stop()
	var info MigrationInfo
	last := ""
	for {
		var err error
		info, err = queryMigrate(ctx, ex)
		if err != nil {
			return info, fmt.Errorf("qmp: wait for migration (last status %q after %v): %w",
				last, time.Since(start).Round(time.Millisecond), err)
		}
		if info.Status != last {
			log.WithField("status", info.Status).Debug("qmp: migration status")
			last = info.Status
		}
		switch info.Status {
		case MigrationCompleted:
			return info, nil
		case MigrationFailed:
			desc := info.ErrorDesc
			if desc == "" {
				desc = "no error-desc given"
			}
			return info, fmt.Errorf("qmp: wait for migration: %w: %s", ErrMigrationFailed, desc)
		case MigrationCancelled:
			return info, fmt.Errorf("qmp: wait for migration: %w: cancelled", ErrMigrationFailed)
		}
		select {
		case <-ticker.C:
		case <-done:
			return info, fmt.Errorf("qmp: wait for migration (last status %q after %v): %w",
				last, time.Since(start).Round(time.Millisecond), connErr())
		case <-ctx.Done():
			return info, fmt.Errorf("qmp: wait for migration (last status %q after %v): %w",
				last, time.Since(start).Round(time.Millisecond), ctx.Err())
		}
	}
}

// orDiscard returns log, or for nil a logger that drops everything: the sequences never use
// logrus's global logger, so the caller chooses fields and sinks.
func orDiscard(log *logrus.Entry) *logrus.Entry {
	if log != nil {
		return log
	}
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.PanicLevel)
	return logrus.NewEntry(l)
}
