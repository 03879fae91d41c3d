package qemustate_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// A completed migration returns QEMU's figures, decoded from query-migrate.
func TestWaitMigrationCompleted(t *testing.T) {
	m := dial(t,
		migrating("setup"),
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "completed", "total-time": 25, "downtime": 3,
			"ram": map[string]any{"transferred": 679304, "total": 268435456}}),
	)
	info, err := qemustate.WaitMigration(t.Context(), m, time.Millisecond, nil)
	if err != nil {
		t.Fatalf("WaitMigration: %v", err)
	}
	want := qemustate.MigrationInfo{Status: "completed", TotalTime: 25, Downtime: 3,
		RAM: qemustate.MigrationRAM{Transferred: 679304, Total: 268435456}}
	if info.Status != want.Status || info.TotalTime != want.TotalTime || info.Downtime != want.Downtime || info.RAM != want.RAM {
		t.Errorf("migration info: got %+v, want %+v", info, want)
	}
}

// The caller's logger gets each state change once, at debug level, and nothing else.
func TestWaitMigrationLogs(t *testing.T) {
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	m := dial(t, migrating("active"), migrating("active"), migrating("completed"))
	if _, err := qemustate.WaitMigration(t.Context(), m, time.Millisecond, logrus.NewEntry(logger)); err != nil {
		t.Fatalf("WaitMigration: %v", err)
	}
	var got []string
	for _, e := range hook.AllEntries() {
		if e.Level != logrus.DebugLevel {
			t.Errorf("entry %q: got level %v, want debug", e.Message, e.Level)
		}
		s, _ := e.Data["status"].(string)
		got = append(got, s)
	}
	if strings.Join(got, " ") != "active completed" {
		t.Errorf("logged states: got %q, want [active completed]", got)
	}
}

func migrating(status string) qmptest.Step {
	return qmptest.Expect("query-migrate").Return(map[string]any{"status": status})
}

func TestWaitMigrationFailed(t *testing.T) {
	const desc = "Unable to write to command: Broken pipe"
	m := dial(t,
		migrating("setup"),
		migrating("active"),
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "failed", "error-desc": desc}),
	)
	info, err := qemustate.WaitMigration(t.Context(), m, time.Millisecond, nil)
	if !errors.Is(err, qemustate.ErrMigrationFailed) {
		t.Fatalf("WaitMigration: got %v, want ErrMigrationFailed", err)
	}
	if !strings.Contains(err.Error(), desc) {
		t.Errorf("error %q does not contain the error-desc %q", err, desc)
	}
	if info.Status != qemustate.MigrationFailed || info.ErrorDesc != desc {
		t.Errorf("info: got %+v, want status failed with the error-desc", info)
	}
}

func TestWaitMigrationCancelled(t *testing.T) {
	m := dial(t, migrating("active"), migrating("cancelling"), migrating("cancelled"))
	info, err := qemustate.WaitMigration(t.Context(), m, time.Millisecond, nil)
	if !errors.Is(err, qemustate.ErrMigrationFailed) {
		t.Fatalf("WaitMigration: got %v, want ErrMigrationFailed", err)
	}
	if !strings.Contains(err.Error(), "cancelled") {
		t.Errorf("error %q does not say cancelled", err)
	}
	if info.Status != qemustate.MigrationCancelled {
		t.Errorf("status: got %q, want %q", info.Status, qemustate.MigrationCancelled)
	}
}

// A failed incoming load makes QEMU exit; the wait must end when the socket closes, not at its
// deadline. The poll interval is long so only the disconnect can end the wait in time.
func TestWaitMigrationQEMUExits(t *testing.T) {
	m := dial(t, migrating("active"), qmptest.Disconnect())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	type result struct {
		info qemustate.MigrationInfo
		err  error
	}
	done := make(chan result, 1)
	go func() {
		info, err := qemustate.WaitMigration(ctx, m, time.Hour, nil)
		done <- result{info, err}
	}()
	select {
	case r := <-done:
		if !errors.Is(r.err, qmp.ErrClosed) {
			t.Errorf("WaitMigration: got %v, want ErrClosed", r.err)
		}
		if !strings.Contains(r.err.Error(), `"active"`) {
			t.Errorf("error %q does not give the last status", r.err)
		}
		if r.info.Status != qemustate.MigrationActive {
			t.Errorf("info status: got %q, want %q", r.info.Status, qemustate.MigrationActive)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitMigration still waiting 5s after QEMU disconnected")
	}
}

// QEMU dying while a query-migrate is in flight ends the wait too.
func TestWaitMigrationQEMUExitsMidCommand(t *testing.T) {
	m := dial(t, migrating("active"), qmptest.Expect("query-migrate").NoReply(), qmptest.Disconnect())
	_, err := qemustate.WaitMigration(t.Context(), m, time.Millisecond, nil)
	if !errors.Is(err, qmp.ErrClosed) {
		t.Fatalf("WaitMigration: got %v, want ErrClosed", err)
	}
}

func TestWaitMigrationDeadline(t *testing.T) {
	m := dial(t, migrating("active"))
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := qemustate.WaitMigration(ctx, m, time.Hour, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitMigration: got %v, want context.DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), `last status "active" after`) {
		t.Errorf("error %q does not give the last status and elapsed time", err)
	}
}

// replyExecutor is a qmp.Executor that is no Monitor (as libvirt's passthrough): it answers every
// command with the next canned reply, through EncodeCommand and DecodeReply.
type replyExecutor struct{ replies []string }

func (r *replyExecutor) Execute(ctx context.Context, cmd string, args, result any) error {
	if _, err := qmp.EncodeCommand(cmd, args); err != nil {
		return err
	}
	reply := r.replies[0]
	r.replies = r.replies[1:]
	return qmp.DecodeReply(cmd, []byte(reply), result)
}

func (r *replyExecutor) ExecuteWithFile(ctx context.Context, cmd string, args any, _ *os.File, result any) error {
	return r.Execute(ctx, cmd, args, result)
}

func TestWaitMigrationOtherExecutor(t *testing.T) {
	ex := &replyExecutor{replies: []string{
		`{"return": {"status": "active"}}`,
		`{"return": {"status": "failed", "error-desc": "Unable to write to file"}}`,
	}}
	info, err := qemustate.WaitMigration(t.Context(), ex, time.Millisecond, nil)
	if !errors.Is(err, qemustate.ErrMigrationFailed) || info.ErrorDesc != "Unable to write to file" {
		t.Fatalf("WaitMigration: got %+v, %v; want failed with its error-desc", info, err)
	}
}
