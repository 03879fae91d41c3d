//go:build integration

package tests

import (
	"encoding/json"
	"strings"
	"testing"
)

// traceEvent is one line of `--trace-json` (cmd/vmfork/progress.go).
type traceEvent struct {
	Event     string   `json:"event"`
	Source    string   `json:"source"`
	Template  string   `json:"template"`
	PauseMS   *float64 `json:"pause_ms"`
	Child     string   `json:"child"`
	Phase     string   `json:"phase"`
	PID       int      `json:"pid"`
	RunningMS *float64 `json:"running_ms"`
	ReadyMS   *float64 `json:"ready_ms"`
	Step      *struct {
		Name   string `json:"name"`
		Status string `json:"status"`
	} `json:"step"`
	Error string `json:"error"`
	// source_frozen: how the driver froze the RAM and what it copied
	// before and inside the pause.
	RAMMode         string `json:"ram_mode"`
	PrecopiedBytes  *int64 `json:"precopied_bytes"`
	PausedCopyBytes *int64 `json:"paused_copy_bytes"`
}

// frozenEvent returns the one source_frozen event in stderr of a fork run
// with --trace-json, or fails the test.
func frozenEvent(t testing.TB, stderr string) traceEvent {
	t.Helper()
	evs := traceEvents(stderr, "source_frozen")
	if len(evs) != 1 || evs[0].RAMMode == "" || evs[0].PrecopiedBytes == nil || evs[0].PausedCopyBytes == nil {
		t.Fatalf("want one source_frozen event with the RAM mode and copies, got %+v in: %s", evs, stderr)
	}
	return evs[0]
}

// traceEvents returns the --trace-json events named event (all of them
// for ""), from stderr text that also holds log lines.
func traceEvents(stderr, event string) []traceEvent {
	var out []traceEvent
	for _, l := range strings.Split(stderr, "\n") {
		var ev traceEvent
		if !strings.HasPrefix(l, "{") || json.Unmarshal([]byte(l), &ev) != nil {
			continue
		}
		if event == "" || ev.Event == event {
			out = append(out, ev)
		}
	}
	return out
}

// A real fork's --trace-json: the source's freeze, then the child's start,
// its QEMU's phases, running, each identity step and ready, in that
// order, with the figures the --json result has.
func TestForkTraceJSON(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("src")
	r := e.ok("fork", "src", "kid", "--json", "--trace-json")
	var res forkJSON
	if err := jsonDecode(r.stdout, &res); err != nil || len(res.Children) != 1 {
		t.Fatalf("fork --json: %v: %s", err, r.stdout)
	}
	c := res.Children[0]
	var got []string
	for _, ev := range traceEvents(r.stderr, "") {
		s := ev.Event
		switch {
		case ev.Phase != "":
			s += " " + ev.Phase
		case ev.Step != nil:
			s += " " + ev.Step.Name
		}
		got = append(got, s)
		switch ev.Event {
		case "source_frozen":
			if ev.Source != "src" || ev.Template != res.Template || ev.PauseMS == nil || *ev.PauseMS != res.PauseMS {
				t.Errorf("source_frozen %+v, want src, template %s, pause %v ms", ev, res.Template, res.PauseMS)
			}
		case "child_ready":
			if ev.Child != "kid" || ev.PID != c.PID || ev.RunningMS == nil || *ev.RunningMS != c.RunningMS ||
				ev.ReadyMS == nil || *ev.ReadyMS != c.ReadyMS {
				t.Errorf("child_ready %+v, want the result's %+v", ev, c)
			}
		case "step_done":
			if ev.Child != "kid" || ev.Step.Status == "failed" || ev.Step.Status == "not_run" {
				t.Errorf("step_done %+v, want a step of kid that ran", ev)
			}
		}
	}
	want := []string{"source_frozen", "child_started", "child_phase qmp_ready", "child_phase state_loaded", "child_running", "step_done vmfork.agent"}
	if len(got) < len(want)+1 || strings.Join(got[:len(want)], ",") != strings.Join(want, ",") || got[len(got)-1] != "child_ready" {
		t.Errorf("events %v, want %v, the other steps, then child_ready", got, want)
	}
	// Without --trace-json a person reads lines, no JSON.
	r = e.ok("fork", "src", "kid2")
	if len(traceEvents(r.stderr, "")) != 0 || !strings.Contains(r.stderr, "child kid2 ready") {
		t.Errorf("fork stderr %q: want progress lines, no events", r.stderr)
	}
}
