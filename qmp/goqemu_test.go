package qmp_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qemu"
	goqmp "github.com/digitalocean/go-qemu/qmp"
	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// go-qemu's higher-level packages run over the adapter.
func TestGoQEMUAdapter(t *testing.T) {
	m := dial(t,
		qmptest.Expect("query-status").Return(map[string]any{"status": "paused", "running": false, "singlestep": false}),
		qmptest.Expect("query-status").Return(map[string]any{"status": "running", "running": true, "singlestep": false}),
		qmptest.Expect("query-name").Return(map[string]string{"name": "web"}),
		qmptest.Expect("x-nonsense").Fail("CommandNotFound", "The command x-nonsense has not been found"),
		qmptest.Emit(qmptest.Event{Name: "RESUME"}),
	)
	mon := m.GoQEMU(5 * time.Second)
	if err := mon.Connect(); err != nil {
		t.Fatalf("Connect: %v", err)
	}

	st, err := raw.NewMonitor(mon).QueryStatus()
	if err != nil {
		t.Fatalf("raw QueryStatus: %v", err)
	}
	if st.Status != raw.RunStatePaused {
		t.Errorf("raw status: got %v, want %v", st.Status, raw.RunStatePaused)
	}

	d, err := qemu.NewDomain(mon, "web")
	if err != nil {
		t.Fatalf("NewDomain: %v", err)
	}
	defer d.Close()
	events, done, err := d.Events()
	if err != nil {
		t.Fatalf("Domain.Events: %v", err)
	}
	defer close(done)

	status, err := d.Status()
	if err != nil {
		t.Fatalf("Domain.Status: %v", err)
	}
	if status != qemu.StatusRunning {
		t.Errorf("domain status: got %v, want %v", status, qemu.StatusRunning)
	}

	out, err := d.Run(goqmp.Command{Execute: "query-name"})
	if err != nil {
		t.Fatalf("Domain.Run: %v", err)
	}
	var reply struct {
		Return struct{ Name string } `json:"return"`
	}
	if err := json.Unmarshal(out, &reply); err != nil {
		t.Fatalf("decode Run output %s: %v", out, err)
	}
	if reply.Return.Name != "web" {
		t.Errorf("Run: got name %q, want %q", reply.Return.Name, "web")
	}

	_, err = mon.Run([]byte(`{"execute":"x-nonsense"}`))
	if !errors.Is(err, qmp.ErrCommandNotFound) {
		t.Errorf("Run of an unknown command: got %v, want ErrCommandNotFound", err)
	}

	select {
	case ev := <-events:
		if ev.Event != "RESUME" || ev.Timestamp.Seconds == 0 {
			t.Errorf("event: got %+v, want RESUME with a timestamp", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event through go-qemu's Domain.Events")
	}
}
