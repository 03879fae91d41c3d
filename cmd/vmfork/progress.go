package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/customize"
)

// traceJSONFlag asks for the fork's trace (vmfork.ForkTrace) as a stream of
// JSON events on stderr, for programs that drive the CLI and time its
// phases: they read events, never log text.
var traceJSONFlag = &cli.BoolFlag{
	Name: "trace-json",
	Usage: "print the fork's progress on stderr as JSON events, one per line (the lines that start with {), instead of " +
		"progress lines: source_frozen, child_started, child_phase, child_running, step_done, child_ready, child_failed",
}

// withProgress returns ctx with the trace that prints the command's
// progress on stderr: JSON events with --trace-json, else a line per frozen
// source, ready child and failed child unless --quiet or a --log-level
// above info asks for less.
func withProgress(ctx context.Context, cliCtx *cli.Context) context.Context {
	if cliCtx.Bool("trace-json") {
		return vmfork.WithForkTrace(ctx, jsonTrace(os.Stderr))
	}
	if cliCtx.Bool("quiet") || !logrus.IsLevelEnabled(logrus.InfoLevel) {
		return ctx
	}
	return vmfork.WithForkTrace(ctx, progressTrace(os.Stderr))
}

// progressTrace prints the progress lines a person reads.
func progressTrace(w io.Writer) *vmfork.ForkTrace {
	var mu sync.Mutex // children's hooks run at once
	line := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, format+"\n", args...)
	}
	return &vmfork.ForkTrace{
		SourceFrozen: func(i vmfork.FrozenInfo) {
			line("source %s frozen into template %s (paused %.1f ms)", i.Source, i.Template, msOf(i.Pause))
		},
		ChildReady: func(i vmfork.ChildReadyInfo) {
			line("child %s ready (running after %.0f ms, ready after %.0f ms)", i.Name, i.RunningMS, i.ReadyMS)
		},
		ChildFailed: func(i vmfork.ChildFailedInfo) {
			line("child %s failed: %v", i.Child, i.Err)
		},
	}
}

// traceEvent is one line of --trace-json. Its form is a contract with the
// programs that read it (the benchmarks, scripts): change it only by adding.
type traceEvent struct {
	Event    string    `json:"event"`
	At       time.Time `json:"at"`
	Source   string    `json:"source,omitempty"`
	Template string    `json:"template,omitempty"`
	Kept     string    `json:"kept,omitempty"`
	PauseMS  *float64  `json:"pause_ms,omitempty"`
	// RAMMode, PrecopiedBytes and PausedCopyBytes: how a live source's
	// RAM was frozen, where the driver tells.
	RAMMode         string                `json:"ram_mode,omitempty"`
	PrecopiedBytes  *int64                `json:"precopied_bytes,omitempty"`
	PausedCopyBytes *int64                `json:"paused_copy_bytes,omitempty"`
	Child           string                `json:"child,omitempty"`
	Index           int                   `json:"index,omitempty"`
	Pooled          bool                  `json:"pooled,omitempty"`
	Phase           vmfork.ChildPhase     `json:"phase,omitempty"`
	PID             int                   `json:"pid,omitempty"`
	RunningMS       *float64              `json:"running_ms,omitempty"`
	ReadyMS         *float64              `json:"ready_ms,omitempty"`
	Step            *customize.StepResult `json:"step,omitempty"`
	Error           string                `json:"error,omitempty"`
}

// Event names of --trace-json, one per ForkTrace hook.
const (
	eventSourceFrozen = "source_frozen"
	eventChildStarted = "child_started"
	eventChildPhase   = "child_phase"
	eventChildRunning = "child_running"
	eventStepDone     = "step_done"
	eventChildReady   = "child_ready"
	eventChildFailed  = "child_failed"
)

// jsonTrace writes each hook's event to w as one JSON line.
func jsonTrace(w io.Writer) *vmfork.ForkTrace {
	var mu sync.Mutex
	emit := func(ev traceEvent) {
		b, err := json.Marshal(ev)
		if err != nil {
			return // every field marshals; nothing to report it to
		}
		mu.Lock()
		defer mu.Unlock()
		w.Write(append(b, '\n'))
	}
	f := func(v float64) *float64 { return &v }
	return &vmfork.ForkTrace{
		SourceFrozen: func(i vmfork.FrozenInfo) {
			ev := traceEvent{Event: eventSourceFrozen, At: i.At, Source: i.Source, Template: i.Template, Kept: i.Kept, PauseMS: f(msOf(i.Pause))}
			if i.RAMMode != "" {
				ev.RAMMode, ev.PrecopiedBytes, ev.PausedCopyBytes = i.RAMMode, &i.PrecopiedBytes, &i.RAMCopiedBytes
			}
			emit(ev)
		},
		ChildStarted: func(i vmfork.ChildStartInfo) {
			emit(traceEvent{Event: eventChildStarted, At: i.At, Child: i.Child, Template: i.Template, Index: i.Index, Pooled: i.Pooled})
		},
		ChildPhase: func(i vmfork.ChildPhaseInfo) {
			emit(traceEvent{Event: eventChildPhase, At: i.At, Child: i.Child, Phase: i.Phase})
		},
		ChildRunning: func(i vmfork.ChildRunningInfo) {
			emit(traceEvent{Event: eventChildRunning, At: i.At, Child: i.Child, PID: i.PID, RunningMS: f(msOf(i.Running))})
		},
		StepDone: func(i vmfork.StepInfo) {
			emit(traceEvent{Event: eventStepDone, At: i.At, Child: i.Child, Step: &i.Result})
		},
		ChildReady: func(i vmfork.ChildReadyInfo) {
			emit(traceEvent{Event: eventChildReady, At: i.At, Child: i.Name, PID: i.PID, RunningMS: f(i.RunningMS), ReadyMS: f(i.ReadyMS)})
		},
		ChildFailed: func(i vmfork.ChildFailedInfo) {
			emit(traceEvent{Event: eventChildFailed, At: i.At, Child: i.Child, Error: i.Err.Error()})
		},
	}
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
