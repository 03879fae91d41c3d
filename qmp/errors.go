package qmp

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Error classes QEMU 7.2 and qemu-ga 7.2 put in an error reply (qapi/error.json, QapiErrorClass).
// Almost every failure is GenericError; the others exist for old clients and are still sent.
const (
	ClassGenericError    = "GenericError"
	ClassCommandNotFound = "CommandNotFound"
	ClassDeviceNotActive = "DeviceNotActive"
	ClassDeviceNotFound  = "DeviceNotFound"
	ClassKVMMissingCap   = "KVMMissingCap"
)

// Sentinels an *Error matches with errors.Is, one per error class.
var (
	ErrGenericError    = errors.New("generic error")
	ErrCommandNotFound = errors.New("command not found")
	ErrDeviceNotActive = errors.New("device not active")
	ErrDeviceNotFound  = errors.New("device not found")
	ErrKVMMissingCap   = errors.New("kvm capability missing")
)

// ErrClosed is wrapped by every error caused by the connection ending: QEMU exited, the guest agent
// socket went away, or the caller closed the client. The error names the command that was cut off.
var ErrClosed = errors.New("connection closed")

var classErrors = map[string]error{
	ClassGenericError:    ErrGenericError,
	ClassCommandNotFound: ErrCommandNotFound,
	ClassDeviceNotActive: ErrDeviceNotActive,
	ClassDeviceNotFound:  ErrDeviceNotFound,
	ClassKVMMissingCap:   ErrKVMMissingCap,
}

// Error is an error reply from QEMU or the guest agent. It keeps the class that go-qemu's
// errors.New(desc) drops, so callers can branch with errors.Is instead of matching Desc.
type Error struct {
	Command string // the command that failed, such as "migrate-incoming"
	Class   string // one of the Class constants, or a class this package does not know
	Desc    string // QEMU's human-readable description
}

func (e *Error) Error() string {
	return fmt.Sprintf("qmp: %s: %s (%s)", e.Command, e.Desc, e.Class)
}

// Is reports whether target is the sentinel for e's class, such as ErrCommandNotFound for
// "CommandNotFound".
func (e *Error) Is(target error) bool {
	s, ok := classErrors[e.Class]
	return ok && s == target
}

// errorBody is the "error" member of a reply.
type errorBody struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

// decodeReply turns a reply's "return" or "error" member into result or an *Error. It is shared by
// the monitor and the agent, whose replies have the same shape.
func decodeReply(cmd string, ret json.RawMessage, e *errorBody, result any) error {
	if e != nil {
		return &Error{Command: cmd, Class: e.Class, Desc: e.Desc}
	}
	if result == nil {
		return nil
	}
	if len(ret) == 0 {
		return fmt.Errorf("qmp: %s: reply has neither return nor error", cmd)
	}
	if err := json.Unmarshal(ret, result); err != nil {
		return fmt.Errorf("qmp: %s: decode reply: %w", cmd, err)
	}
	return nil
}
