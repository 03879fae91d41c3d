package qmp_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// The parent fork sequence of the reference (§5), through the typed helpers, with its arguments.
func TestForkSequenceArgs(t *testing.T) {
	m := dial(t,
		qmptest.Expect("stop").WithArgs(nil).EventsFirst(qmptest.Event{Name: qmp.EventStop}),
		qmptest.Expect("blockdev-snapshot-sync").WithArgs(map[string]string{
			"node-name":          "fmt0",
			"snapshot-file":      "/m/web/disk.2.qcow2",
			"snapshot-node-name": "fmt0-2",
			"format":             "qcow2",
		}),
		qmptest.Expect("migrate-set-capabilities").WithArgs(map[string]any{
			"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}},
		}),
		qmptest.Expect("migrate").WithArgs(map[string]string{"uri": "fd:mig"}),
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "completed", "total-time": 25, "downtime": 3,
			"ram": map[string]any{"transferred": 679304, "total": 268435456}}),
		qmptest.Expect("cont").WithArgs(nil),
		qmptest.Expect("query-status").Return(map[string]any{"status": "running", "running": true, "singlestep": false}),
		qmptest.Expect("set_link").WithArgs(map[string]any{"name": "nic0", "up": false}),
		qmptest.Expect("query-vm-generation-id").Return(map[string]string{"guid": "324e6eaf-d1d1-4bf6-bf41-b9bb6c91fb87"}),
		qmptest.Expect("system_powerdown"),
	)
	ctx := t.Context()
	steps := []struct {
		name string
		fn   func() error
	}{
		{"Stop", func() error { return m.Stop(ctx) }},
		{"BlockdevSnapshotSync", func() error {
			return m.BlockdevSnapshotSync(ctx, qmp.BlockdevSnapshot{
				Node: "fmt0", File: "/m/web/disk.2.qcow2", SnapshotNode: "fmt0-2", Format: "qcow2",
			})
		}},
		{"MigrateSetCapabilities", func() error {
			return m.MigrateSetCapabilities(ctx, []qmp.Capability{{Name: qmp.CapXIgnoreShared, State: true}})
		}},
		{"Migrate", func() error { return m.Migrate(ctx, "fd:mig") }},
	}
	for _, s := range steps {
		if err := s.fn(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}
	info, err := m.WaitMigration(ctx, time.Millisecond)
	if err != nil {
		t.Fatalf("WaitMigration: %v", err)
	}
	want := qmp.MigrationInfo{Status: "completed", TotalTime: 25, Downtime: 3,
		RAM: qmp.MigrationRAM{Transferred: 679304, Total: 268435456}}
	if info.Status != want.Status || info.TotalTime != want.TotalTime || info.Downtime != want.Downtime || info.RAM != want.RAM {
		t.Errorf("migration info: got %+v, want %+v", info, want)
	}
	if err := m.Cont(ctx); err != nil {
		t.Fatalf("Cont: %v", err)
	}
	st, err := m.QueryStatus(ctx)
	if err != nil {
		t.Fatalf("QueryStatus: %v", err)
	}
	if want := (qmp.Status{Status: "running", Running: true}); st != want {
		t.Errorf("status: got %+v, want %+v", st, want)
	}
	if err := m.SetLink(ctx, "nic0", false); err != nil {
		t.Fatalf("SetLink: %v", err)
	}
	guid, err := m.QueryVMGenerationID(ctx)
	if err != nil {
		t.Fatalf("QueryVMGenerationID: %v", err)
	}
	if guid != "324e6eaf-d1d1-4bf6-bf41-b9bb6c91fb87" {
		t.Errorf("guid: got %q, want %q", guid, "324e6eaf-d1d1-4bf6-bf41-b9bb6c91fb87")
	}
	if err := m.SystemPowerdown(ctx); err != nil {
		t.Fatalf("SystemPowerdown: %v", err)
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
	info, err := m.WaitMigration(t.Context(), time.Millisecond)
	if !errors.Is(err, qmp.ErrMigrationFailed) {
		t.Fatalf("WaitMigration: got %v, want ErrMigrationFailed", err)
	}
	if !strings.Contains(err.Error(), desc) {
		t.Errorf("error %q does not contain the error-desc %q", err, desc)
	}
	if info.Status != qmp.MigrationFailed || info.ErrorDesc != desc {
		t.Errorf("info: got %+v, want status failed with the error-desc", info)
	}
}

func TestWaitMigrationCancelled(t *testing.T) {
	m := dial(t, migrating("active"), migrating("cancelling"), migrating("cancelled"))
	info, err := m.WaitMigration(t.Context(), time.Millisecond)
	if !errors.Is(err, qmp.ErrMigrationFailed) {
		t.Fatalf("WaitMigration: got %v, want ErrMigrationFailed", err)
	}
	if !strings.Contains(err.Error(), "cancelled") {
		t.Errorf("error %q does not say cancelled", err)
	}
	if info.Status != qmp.MigrationCancelled {
		t.Errorf("status: got %q, want %q", info.Status, qmp.MigrationCancelled)
	}
}

// A failed incoming load makes QEMU exit; the wait must end when the socket closes, not at its
// deadline. The poll interval is long so only the disconnect can end the wait in time.
func TestWaitMigrationQEMUExits(t *testing.T) {
	m := dial(t, migrating("active"), qmptest.Disconnect())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	type result struct {
		info qmp.MigrationInfo
		err  error
	}
	done := make(chan result, 1)
	go func() {
		info, err := m.WaitMigration(ctx, time.Hour)
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
		if r.info.Status != qmp.MigrationActive {
			t.Errorf("info status: got %q, want %q", r.info.Status, qmp.MigrationActive)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitMigration still waiting 5s after QEMU disconnected")
	}
}

// QEMU dying while a query-migrate is in flight ends the wait too.
func TestWaitMigrationQEMUExitsMidCommand(t *testing.T) {
	m := dial(t, migrating("active"), qmptest.Expect("query-migrate").NoReply(), qmptest.Disconnect())
	_, err := m.WaitMigration(t.Context(), time.Millisecond)
	if !errors.Is(err, qmp.ErrClosed) {
		t.Fatalf("WaitMigration: got %v, want ErrClosed", err)
	}
}

func TestWaitMigrationDeadline(t *testing.T) {
	m := dial(t, migrating("active"))
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := m.WaitMigration(ctx, time.Hour)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitMigration: got %v, want context.DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), `last status "active" after`) {
		t.Errorf("error %q does not give the last status and elapsed time", err)
	}
}

// Quit succeeds whether QEMU answers before exiting or exits first.
func TestQuit(t *testing.T) {
	t.Run("reply", func(t *testing.T) {
		m := dial(t, qmptest.Expect("quit"), qmptest.Disconnect())
		if err := m.Quit(t.Context()); err != nil {
			t.Errorf("Quit: got %v, want nil", err)
		}
	})
	t.Run("no reply", func(t *testing.T) {
		m := dial(t, qmptest.Expect("quit").NoReply(), qmptest.Disconnect())
		if err := m.Quit(t.Context()); err != nil {
			t.Errorf("Quit: got %v, want nil", err)
		}
	})
	t.Run("already closed", func(t *testing.T) {
		m := dial(t)
		m.Close()
		if err := m.Quit(t.Context()); !errors.Is(err, qmp.ErrClosed) {
			t.Errorf("Quit on a closed monitor: got %v, want ErrClosed", err)
		}
	})
}
