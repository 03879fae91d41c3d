package qmp_test

import (
	"errors"
	"testing"

	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// The plain commands of the parent fork sequence of the reference (§5), through the typed helpers,
// with their arguments. The migration in between is package qemustate's (its tests).
func TestForkSequenceArgs(t *testing.T) {
	m := dial(t,
		qmptest.Expect("stop").WithArgs(nil).EventsFirst(qmptest.Event{Name: qmp.EventStop}),
		qmptest.Expect("blockdev-snapshot-sync").WithArgs(map[string]string{
			"node-name":          "fmt0",
			"snapshot-file":      "/m/web/disk.2.qcow2",
			"snapshot-node-name": "fmt0-2",
			"format":             "qcow2",
		}),
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
	}
	for _, s := range steps {
		if err := s.fn(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
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
