// Package qmptest provides scripted wire fakes of a QEMU QMP socket and a qemu-ga socket, for
// unit tests of package qmp and of code built on it. Nothing here starts QEMU.
//
// A test lists the commands it expects, in order, with their replies:
//
//	sock := qmptest.NewServer(t,
//		qmptest.Expect("stop"),
//		qmptest.Expect("migrate").WithArgs(map[string]string{"uri": "fd:mig"}),
//		qmptest.Expect("query-migrate").Return(map[string]string{"status": "completed"}),
//		qmptest.Emit(qmptest.Event{Name: "RESUME"}),
//	)
//	mon, err := qmp.Dial(t.Context(), sock)
//
// The QMP fake sends a QEMU 7.2 greeting and answers qmp_capabilities itself; the agent fake
// answers guest-sync-delimited itself. A command that differs from the script, or any command
// after the script's end, fails the test, and so does a script with expected commands left
// over when the test ends. Failures are recorded by the server goroutine and reported with
// t.Errorf from t.Cleanup, never with t.Fatal from a goroutine.
package qmptest

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
)

// Event is an event for the QMP fake to send. Data is marshalled to JSON; nil sends no data.
type Event struct {
	Name string
	Data any
}

type stepKind int

const (
	kindExpect stepKind = iota
	kindEmit
	kindRaw
	kindDisconnect
	kindWait
)

// Step is one entry of a fake's script. Build it with Expect, Emit, Raw, Disconnect or Wait and
// refine an Expect with its methods; each method returns a modified copy.
type Step struct {
	kind    stepKind
	command string
	args    func(json.RawMessage) error
	ret     any
	fail    *errorBody
	events  []Event
	raw     []byte
	late    bool
	noReply bool
	fd      func(*os.File) error
	wait    <-chan struct{}
}

type errorBody struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

// Expect waits for the client's next command, which must be command. By default the reply is
// {"return": {}}.
func Expect(command string) Step {
	return Step{kind: kindExpect, command: command}
}

// WithArgs makes the step check the command's arguments: they must equal want once both are
// JSON-encoded and decoded again, so maps and structs compare by content. A nil want requires
// that the command has no arguments.
func (s Step) WithArgs(want any) Step {
	s.args = func(got json.RawMessage) error {
		w, err := json.Marshal(want)
		if err != nil {
			return fmt.Errorf("encode wanted arguments: %w", err)
		}
		if len(got) == 0 {
			got = json.RawMessage("null")
		}
		var gv, wv any
		if err := json.Unmarshal(got, &gv); err != nil {
			return fmt.Errorf("decode arguments: %w", err)
		}
		if err := json.Unmarshal(w, &wv); err != nil {
			return fmt.Errorf("decode wanted arguments: %w", err)
		}
		if !reflect.DeepEqual(gv, wv) {
			return fmt.Errorf("got arguments %s, want %s", got, w)
		}
		return nil
	}
	return s
}

// CheckArgs makes the step pass the raw arguments (nil when absent) to fn; an error fails the test.
func (s Step) CheckArgs(fn func(args json.RawMessage) error) Step {
	s.args = fn
	return s
}

// Return makes the reply {"return": v}.
func (s Step) Return(v any) Step {
	s.ret, s.fail = v, nil
	return s
}

// Fail makes the reply an error of class (such as "GenericError") with desc.
func (s Step) Fail(class, desc string) Step {
	s.fail = &errorBody{Class: class, Desc: desc}
	return s
}

// EventsFirst sends evs after the command arrives and before its reply, as QEMU does for a "stop"
// that emits STOP.
func (s Step) EventsFirst(evs ...Event) Step {
	s.events = append(append([]Event(nil), s.events...), evs...)
	return s
}

// Late holds the reply back: it goes out just before the next reply the fake sends (another
// command's, or the agent's next sync reply). This models a reply that arrives after the caller
// gave up.
func (s Step) Late() Step {
	s.late = true
	return s
}

// NoReply receives the command and never answers it, as a QEMU that dies mid-command.
func (s Step) NoReply() Step {
	s.noReply = true
	return s
}

// ReceiveFD requires a file descriptor passed with the command (SCM_RIGHTS) and calls fn with it;
// an error fails the test. The fake closes the file after fn. QMP fake only.
func (s Step) ReceiveFD(fn func(f *os.File) error) Step {
	s.fd = fn
	return s
}

// Emit sends events at this point of the script, without waiting for a command.
func Emit(evs ...Event) Step {
	return Step{kind: kindEmit, events: evs}
}

// Raw writes data as is at this point of the script, for malformed or stale output.
func Raw(data []byte) Step {
	return Step{kind: kindRaw, raw: data}
}

// Disconnect closes the connection at this point of the script, as QEMU exiting. The fake then
// accepts a new connection, which continues with the next step (and, for QMP, a new greeting).
func Disconnect() Step {
	return Step{kind: kindDisconnect}
}

// Wait pauses the script until ch is closed, so a test can act between two steps.
func Wait(ch <-chan struct{}) Step {
	return Step{kind: kindWait, wait: ch}
}
