package qemustate_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// dial connects to a fake and closes the monitor when the test ends, before the fake stops.
func dial(t *testing.T, script ...qmptest.Step) *qmp.Monitor {
	t.Helper()
	sock := qmptest.NewServer(t, script...)
	m, err := qmp.Dial(t.Context(), sock)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

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
	if err := qemustate.PrepareSave(ctx, m); err != nil {
		t.Fatalf("PrepareSave: %v", err)
	}
	release, err := qemustate.CreateSaveFile(ctx, m, "ds", path)
	if err != nil {
		t.Fatalf("CreateSaveFile: %v", err)
	}
	if err := qemustate.SaveDeviceState(ctx, m, "ds", time.Millisecond, nil); err != nil {
		t.Fatalf("SaveDeviceState: %v", err)
	}
	release()
	if _, err := qemustate.CreateSaveFile(ctx, m, "ds", path); err == nil {
		t.Errorf("CreateSaveFile on an existing file: got nil error, want one")
	}
}

func TestPrepareSaveBlocked(t *testing.T) {
	m := dial(t, qmptest.Expect("query-migrate").Return(map[string]any{
		"status": "none", "blocked-reasons": []string{"VFIO device doesn't support migration"},
	}))
	err := qemustate.PrepareSave(t.Context(), m)
	if !errors.Is(err, qemustate.ErrMigrationBlocked) {
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
	if err := qemustate.SaveDeviceState(ctx, m, "ds", time.Hour, nil); !errors.Is(err, context.DeadlineExceeded) {
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
	if err := qemustate.LoadDeviceState(t.Context(), m, "ds", path, time.Millisecond, nil); err != nil {
		t.Fatalf("LoadDeviceState: %v", err)
	}
}
