package qmp_test

import (
	"testing"

	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// The plain commands of the parent fork sequence of the reference (§5), through the typed helpers,
// with their arguments. The migration in between is package qemustate's (its tests).
func TestForkSequenceArgs(t *testing.T) {
	m := dial(t,
		qmptest.Expect("stop").WithArgs(nil).EventsFirst(qmptest.Event{Name: qmp.EventStop}),
		qmptest.Expect("cont").WithArgs(nil),
		qmptest.Expect("query-status").Return(map[string]any{"status": "running", "running": true, "singlestep": false}),
		qmptest.Expect("set_link").WithArgs(map[string]any{"name": "nic0", "up": false}),
		qmptest.Expect("query-vm-generation-id").Return(map[string]string{"guid": "324e6eaf-d1d1-4bf6-bf41-b9bb6c91fb87"}),
	)
	ctx := t.Context()
	if err := m.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
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
	guid, err := qmp.QueryVMGenerationID(ctx, m)
	if err != nil {
		t.Fatalf("QueryVMGenerationID: %v", err)
	}
	if guid != "324e6eaf-d1d1-4bf6-bf41-b9bb6c91fb87" {
		t.Errorf("guid: got %q, want %q", guid, "324e6eaf-d1d1-4bf6-bf41-b9bb6c91fb87")
	}
}
