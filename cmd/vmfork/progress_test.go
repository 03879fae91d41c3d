package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/customize"
)

// Every hook of --trace-json writes one JSON line with its event's name
// and figures; the figures in ms are present even when zero.
func TestJSONTraceEvents(t *testing.T) {
	var buf bytes.Buffer
	tr := jsonTrace(&buf)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tr.SourceFrozen(vmfork.FrozenInfo{Source: "web", Template: "web.1", Pause: 1500 * time.Microsecond, RAMMode: "diff", RAMCopiedBytes: 4096, At: at})
	tr.SourceFrozen(vmfork.FrozenInfo{Source: "off", Template: "off.1", Kept: "gold", At: at})
	tr.ChildStarted(vmfork.ChildStartInfo{Child: "web-1", Template: "web.1", Index: 1, At: at})
	tr.ChildPhase(vmfork.ChildPhaseInfo{Child: "web-1", Phase: vmfork.PhaseQMPReady, At: at})
	tr.ChildRunning(vmfork.ChildRunningInfo{Child: "web-1", PID: 7, Running: 20 * time.Millisecond, At: at})
	tr.StepDone(vmfork.StepInfo{Child: "web-1", Result: customize.StepResult{Name: "vmfork.agent", Status: customize.StatusOK}, At: at})
	tr.ChildReady(vmfork.ChildReadyInfo{ChildResult: vmfork.ChildResult{Name: "web-1", PID: 7, RunningMS: 20}, At: at})
	tr.ChildFailed(vmfork.ChildFailedInfo{Child: "web-2", Err: errors.New("boom"), At: at})
	want := []string{
		`{"event":"source_frozen","at":"2026-01-02T03:04:05Z","source":"web","template":"web.1","pause_ms":1.5,"ram_mode":"diff","precopied_bytes":0,"paused_copy_bytes":4096}`,
		`{"event":"source_frozen","at":"2026-01-02T03:04:05Z","source":"off","template":"off.1","kept":"gold","pause_ms":0}`,
		`{"event":"child_started","at":"2026-01-02T03:04:05Z","template":"web.1","child":"web-1","index":1}`,
		`{"event":"child_phase","at":"2026-01-02T03:04:05Z","child":"web-1","phase":"qmp_ready"}`,
		`{"event":"child_running","at":"2026-01-02T03:04:05Z","child":"web-1","pid":7,"running_ms":20}`,
		`{"event":"step_done","at":"2026-01-02T03:04:05Z","child":"web-1","step":{"name":"vmfork.agent","status":"ok","duration_ms":0}}`,
		`{"event":"child_ready","at":"2026-01-02T03:04:05Z","child":"web-1","pid":7,"running_ms":20,"ready_ms":0}`,
		`{"event":"child_failed","at":"2026-01-02T03:04:05Z","child":"web-2","error":"boom"}`,
	}
	got := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(got), len(want), buf.String())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i+1, got[i], want[i])
		}
		if !json.Valid([]byte(got[i])) {
			t.Errorf("line %d is not JSON", i+1)
		}
	}
}

// The lines a person reads: a frozen source, each ready and failed child.
func TestProgressTraceLines(t *testing.T) {
	var buf bytes.Buffer
	tr := progressTrace(&buf)
	tr.SourceFrozen(vmfork.FrozenInfo{Source: "web", Template: "web.1", Pause: 12300 * time.Microsecond})
	tr.ChildReady(vmfork.ChildReadyInfo{ChildResult: vmfork.ChildResult{Name: "web-1", RunningMS: 120, ReadyMS: 450}})
	tr.ChildFailed(vmfork.ChildFailedInfo{Child: "web-2", Err: errors.New("identity: boom")})
	want := "source web frozen into template web.1 (paused 12.3 ms)\n" +
		"child web-1 ready (running after 120 ms, ready after 450 ms)\n" +
		"child web-2 failed: identity: boom\n"
	if got := buf.String(); got != want {
		t.Errorf("got:\n%swant:\n%s", got, want)
	}
	if tr.ChildStarted != nil || tr.StepDone != nil {
		t.Errorf("progress lines print starts or steps; want only frozen, ready, failed")
	}
}
