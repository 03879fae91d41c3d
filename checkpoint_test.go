package vmfork

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckpointAndRewind(t *testing.T) {
	mg, pd := newPoolManager(t)
	bootFake(t, mg, "web")
	bootFake(t, mg, "db")
	before, _ := mg.Store.LoadMachine("web")
	before.Spec.MAC = "52:54:00:00:00:99" // the fake driver resolves none
	if err := mg.Store.SaveMachine(before); err != nil {
		t.Fatal(err)
	}
	tpl, err := mg.Checkpoint(t.Context(), CheckpointRequest{Machine: "web", Identity: quietChain})
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Name != "web-cp1" || tpl.Source != "web" || !tpl.HasMemory {
		t.Fatalf("checkpoint = %+v, want web-cp1 of web with memory", tpl)
	}
	cps, err := mg.Checkpoints(t.Context(), "web")
	if err != nil || len(cps) != 1 || cps[0].Name != "web-cp1" {
		t.Fatalf("checkpoints of web = %+v, %v", cps, err)
	}
	for i := 0; i < 2; i++ { // a second rewind to the same checkpoint works too
		res, err := mg.Rewind(t.Context(), RewindRequest{Machine: "web", To: "web-cp1", Identity: quietChain})
		if err != nil {
			t.Fatalf("rewind %d: %v", i+1, err)
		}
		m, err := mg.Store.LoadMachine("web")
		if err != nil || res.Name != "web" || m.State != StateRunning || m.Template != tpl.ID || !pd.running["web"] {
			t.Fatalf("after rewind %d: %+v (%v), want web running from %s", i+1, m, err, tpl.ID)
		}
		if m.GuestMAC != before.Spec.MAC || m.Created != before.Created || m.Paths.Dir != before.Paths.Dir {
			t.Errorf("rewind %d changed web's MAC, creation or directory: %+v, was %+v", i+1, m, before)
		}
	}
	_, err = mg.Rewind(t.Context(), RewindRequest{Machine: "db", To: "web-cp1", Identity: quietChain})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--force") {
		t.Errorf("rewind db to web's checkpoint: %v, want a refusal naming --force", err)
	}
	if m, _ := mg.Store.LoadMachine("db"); m.State != StateRunning || m.Template != "" {
		t.Errorf("a refused rewind touched db: %+v", m)
	}
	if _, err := mg.Rewind(t.Context(), RewindRequest{Machine: "db", To: "web-cp1", Force: true, Identity: quietChain}); err != nil {
		t.Errorf("forced rewind: %v", err)
	}
	if _, err := mg.Rewind(t.Context(), RewindRequest{Machine: "web", To: "nope", Identity: quietChain}); !errors.Is(err, ErrNotFound) {
		t.Errorf("rewind to no template: %v, want ErrNotFound", err)
	}
}

func TestRewindNeedsInPlaceStarts(t *testing.T) {
	mg, _ := newTestManager(t) // no warm pool: like the libvirt driver
	bootFake(t, mg, "web")
	_, err := mg.Rewind(t.Context(), RewindRequest{Machine: "web", To: "web-cp1"})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), `not supported by the fake driver`) {
		t.Errorf("rewind: %v, want not supported by the driver", err)
	}
}

// A rewind killed once its new process ran is undone by the next command:
// the machine is stopped on its record from before, the new process gone.
func TestRewindInterruptedIsUndone(t *testing.T) {
	mg, pd := newPoolManager(t)
	bootFake(t, mg, "web")
	tpl, err := mg.Checkpoint(t.Context(), CheckpointRequest{Machine: "web", Identity: quietChain})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := mg.Store.LoadMachine("web")
	prior := *m
	prior.State, prior.PID = StateStopped, 0
	if _, err := mg.Store.journal(journalEntry{Op: "rewind", Source: "web", Template: tpl.ID, Prior: &prior}); err != nil {
		t.Fatal(err)
	}
	pd.Stop(t.Context(), m, true)
	c, err := mg.rewoundMachine(t.Context(), m, tpl, quietChain)
	if err != nil {
		t.Fatal(err)
	}
	if err := pd.StartChild(t.Context(), c, tpl); err != nil {
		t.Fatal(err)
	}
	orphanJournal(t, mg.Store)
	if err := mg.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	m, _ = mg.Get(t.Context(), "web")
	if m.State != StateStopped || m.Template != "" || pd.running["web"] {
		t.Errorf("after the repair: %+v (running %v), want web stopped on its record from before", m, pd.running["web"])
	}
	if _, err := mg.Rewind(t.Context(), RewindRequest{Machine: "web", To: tpl.Name, Identity: quietChain}); err != nil {
		t.Errorf("rewind after the repair: %v", err)
	}
}
