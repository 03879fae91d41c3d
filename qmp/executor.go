package qmp

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	goqmp "github.com/digitalocean/go-qemu/qmp"
)

// Executor runs QMP commands. *Monitor is one, on its own socket. Where another program owns the
// socket (libvirt, through virDomainQemuMonitorCommand[WithFiles]), the caller provides its own,
// built on EncodeCommand and DecodeReply; the sequences in this package (device-state save and
// load, WaitMigration) then run unchanged on either.
type Executor interface {
	// Execute runs cmd with args and decodes the reply's "return" into result, as Monitor.Execute.
	Execute(ctx context.Context, cmd string, args, result any) error
	// ExecuteWithFile is Execute that also passes f to QEMU, as getfd needs. QEMU keeps its own
	// duplicate, so the caller may close f when the call returns.
	ExecuteWithFile(ctx context.Context, cmd string, args any, f *os.File, result any) error
}

var _ Executor = (*Monitor)(nil)

// EncodeCommand returns the JSON request for cmd with args, without an id, for a transport that
// carries one command at a time. A nil args (also a typed nil) sends no "arguments": QEMU rejects
// "arguments": null.
func EncodeCommand(cmd string, args any) ([]byte, error) {
	req, err := json.Marshal(goqmp.Command{Execute: cmd, Args: omitNil(args)})
	if err != nil {
		return nil, fmt.Errorf("qmp: %s: encode arguments: %w", cmd, err)
	}
	return req, nil
}

// DecodeReply decodes one whole reply object to cmd: its "return" into result (nil ignores it),
// or its "error" as an *Error. QEMU and qemu-ga replies have the same shape.
func DecodeReply(cmd string, reply []byte, result any) error {
	var r struct {
		Return json.RawMessage `json:"return"`
		Error  *errorBody      `json:"error"`
	}
	if err := json.Unmarshal(reply, &r); err != nil {
		return fmt.Errorf("qmp: %s: decode reply %.80q: %w", cmd, reply, err)
	}
	return decodeReply(cmd, r.Return, r.Error, result)
}
