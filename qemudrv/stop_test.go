package qemudrv

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp/qmptest"
)

// Stop's escalation, one rung at a time: the guest agent's shutdown, the
// ACPI power button, QMP quit, SIGKILL. Each rung is tried only when the one
// before did not end QEMU within its bound, and the whole stop stays bounded.
func TestStopEscalation(t *testing.T) {
	powerdown := func(args json.RawMessage) error {
		if len(args) != 0 && string(args) != "null" && string(args) != "{}" {
			return fmt.Errorf("system_powerdown got arguments %s", args)
		}
		return nil
	}
	for _, tc := range []struct {
		name string
		// agent and qmp build the scripts of the fake sockets for q; nil
		// leaves nothing listening there.
		agent, qmp func(q *fakeQEMU) []qmptest.Step
		survives   []syscall.Signal
		wantSigs   []syscall.Signal
		wantErr    string
	}{{
		name: "agent shutdown",
		agent: func(q *fakeQEMU) []qmptest.Step {
			return []qmptest.Step{qmptest.Expect("guest-shutdown").CheckArgs(func(args json.RawMessage) error {
				q.exit()
				if !strings.Contains(string(args), `"powerdown"`) {
					return fmt.Errorf("guest-shutdown got %s, want mode powerdown", args)
				}
				return nil
			})}
		},
		// The disks flushed first (flushDisks), then no other QMP command.
		qmp: func(*fakeQEMU) []qmptest.Step { return flushSteps() },
	}, {
		name: "power button",
		qmp: func(q *fakeQEMU) []qmptest.Step {
			return append(flushSteps(), qmptest.Expect("system_powerdown").CheckArgs(func(args json.RawMessage) error {
				q.exit()
				return powerdown(args)
			}))
		},
	}, {
		name: "quit after an ignored power button",
		qmp: func(q *fakeQEMU) []qmptest.Step {
			return append(flushSteps(),
				qmptest.Expect("system_powerdown").CheckArgs(powerdown),
				qmptest.Expect("quit").CheckArgs(func(json.RawMessage) error { q.exit(); return nil }),
			)
		},
	}, {
		name: "SIGKILL after an ignored quit",
		qmp: func(*fakeQEMU) []qmptest.Step {
			return append(flushSteps(), qmptest.Expect("system_powerdown"), qmptest.Expect("quit"))
		},
		wantSigs: []syscall.Signal{syscall.SIGKILL},
	}, {
		name:     "SIGKILL when QMP is gone",
		wantSigs: []syscall.Signal{syscall.SIGKILL},
	}, {
		name:     "QEMU survives SIGKILL",
		survives: []syscall.Signal{syscall.SIGKILL},
		wantSigs: []syscall.Signal{syscall.SIGKILL},
		wantErr:  "QEMU (pid " + strconv.Itoa(fakePID) + ") survived SIGKILL",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			q := newFakeQEMU()
			q.survives = tc.survives
			var qmpSock, qgaSock string
			if tc.qmp != nil {
				qmpSock = qmptest.NewServer(t, tc.qmp(q)...)
			}
			if tc.agent != nil {
				qgaSock = qmptest.NewAgentServer(t, tc.agent(q)...)
			}
			d := testDriver(t, q)
			m := fakeMachine(t, "web", qmpSock, qgaSock)
			start := time.Now()
			err := d.Stop(t.Context(), m, false)
			took := time.Since(start)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("Stop: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Stop: got %v, want an error containing %q", err, tc.wantErr)
			}
			if got := q.signals(); !slices.Equal(got, tc.wantSigs) {
				t.Errorf("signals sent: got %v, want %v", got, tc.wantSigs)
			}
			// Agent, power button and quit waits (300ms each here), and
			// the wait after SIGKILL: nothing may wait beyond them.
			if limit := 4*300*time.Millisecond + time.Second; took > limit {
				t.Errorf("Stop took %v, want under %v", took, limit)
			}
		})
	}
}

// flushSteps is what Stop asks of QMP first: a pause and a resume, whose
// vm_stop flushes every disk (flushDisks).
func flushSteps() []qmptest.Step {
	return []qmptest.Step{qmptest.Expect("stop"), qmptest.Expect("cont")}
}

// A forced stop kills at once: no agent, no QMP.
func TestStopForce(t *testing.T) {
	q := newFakeQEMU()
	d := testDriver(t, q)
	m := fakeMachine(t, "web", qmptest.NewServer(t), qmptest.NewAgentServer(t))
	if err := d.Stop(t.Context(), m, true); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if got := q.signals(); !slices.Equal(got, []syscall.Signal{syscall.SIGKILL}) {
		t.Errorf("signals sent: got %v, want [SIGKILL]", got)
	}
}

// Stop of a machine whose QEMU is gone does nothing and succeeds
// (idempotent); it signals no PID, which may be another process's by now.
func TestStopGone(t *testing.T) {
	q := newFakeQEMU()
	q.exit()
	d := testDriver(t, q)
	m := fakeMachine(t, "web", qmptest.NewServer(t), qmptest.NewAgentServer(t))
	for i := range 2 {
		if err := d.Stop(t.Context(), m, false); err != nil {
			t.Fatalf("Stop #%d: %v", i+1, err)
		}
	}
	if got := q.signals(); len(got) != 0 {
		t.Errorf("signals sent: got %v, want none", got)
	}
}
