package qmp_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// The device-state save of a freeze, in the order a driver runs it.
func TestSaveSequence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "devstate")
	m := dial(t,
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "none"}),
		qmptest.Expect("migrate-set-capabilities").WithArgs(map[string]any{
			"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}},
		}),
		qmptest.Expect("getfd").WithArgs(map[string]string{"fdname": "ds"}).ReceiveFD(func(*os.File) error { return nil }),
		qmptest.Expect("migrate").WithArgs(map[string]string{"uri": "fd:ds"}),
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "completed"}),
		qmptest.Expect("closefd").WithArgs(map[string]string{"fdname": "ds"}).Fail(qmp.ClassGenericError, "File descriptor named 'ds' not found"),
	)
	ctx := t.Context()
	if err := qmp.PrepareSave(ctx, m); err != nil {
		t.Fatalf("PrepareSave: %v", err)
	}
	release, err := qmp.CreateSaveFile(ctx, m, "ds", path)
	if err != nil {
		t.Fatalf("CreateSaveFile: %v", err)
	}
	if err := qmp.SaveDeviceState(ctx, m, "ds", time.Millisecond); err != nil {
		t.Fatalf("SaveDeviceState: %v", err)
	}
	release()
	if _, err := qmp.CreateSaveFile(ctx, m, "ds", path); err == nil {
		t.Errorf("CreateSaveFile on an existing file: got nil error, want one")
	}
}

func TestPrepareSaveBlocked(t *testing.T) {
	m := dial(t, qmptest.Expect("query-migrate").Return(map[string]any{
		"status": "none", "blocked-reasons": []string{"VFIO device doesn't support migration"},
	}))
	err := qmp.PrepareSave(t.Context(), m)
	if !errors.Is(err, qmp.ErrMigrationBlocked) {
		t.Fatalf("PrepareSave: got %v, want ErrMigrationBlocked", err)
	}
}

// A save cut short by its ctx cancels the migration, which would otherwise stop the VM again when
// it completes after the caller resumed it.
func TestSaveDeviceStateCancelled(t *testing.T) {
	m := dial(t,
		qmptest.Expect("migrate").WithArgs(map[string]string{"uri": "fd:ds"}),
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "active"}),
		qmptest.Expect("migrate_cancel"),
	)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := qmp.SaveDeviceState(ctx, m, "ds", time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SaveDeviceState: got %v, want context.DeadlineExceeded", err)
	}
}

func TestLoadDeviceState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "devstate")
	if err := os.WriteFile(path, []byte("QEVM"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := dial(t,
		qmptest.Expect("getfd").WithArgs(map[string]string{"fdname": "ds"}).ReceiveFD(func(*os.File) error { return nil }),
		qmptest.Expect("migrate-incoming").WithArgs(map[string]string{"uri": "fd:ds"}),
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "active"}),
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "completed"}),
	)
	if err := qmp.LoadDeviceState(t.Context(), m, "ds", path, time.Millisecond); err != nil {
		t.Fatalf("LoadDeviceState: %v", err)
	}
}

// replyExecutor is an Executor that is no Monitor (as libvirt's passthrough): it answers every
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
	info, err := qmp.WaitMigration(t.Context(), ex, time.Millisecond)
	if !errors.Is(err, qmp.ErrMigrationFailed) || info.ErrorDesc != "Unable to write to file" {
		t.Fatalf("WaitMigration: got %+v, %v; want failed with its error-desc", info, err)
	}
	ex = &replyExecutor{replies: []string{`{"error": {"class": "GenericError", "desc": "no vmgenid"}}`}}
	var qerr *qmp.Error
	if _, err := qmp.QueryVMGenerationID(t.Context(), ex); !errors.As(err, &qerr) || qerr.Desc != "no vmgenid" {
		t.Fatalf("QueryVMGenerationID: got %v, want a *qmp.Error", err)
	}
}
