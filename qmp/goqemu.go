package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"
)

// GoQEMUMonitor adapts a Monitor to go-qemu's four-method qmp.Monitor, so go-qemu's qemu.Domain
// and qmp/raw helpers can run over this client (see the package documentation for why go-qemu's
// own SocketMonitor is not used). go-qemu's interface has no contexts; the adapter bounds each Run
// by its timeout instead, and every Run still fails at once when QEMU exits.
type GoQEMUMonitor struct {
	m       *Monitor
	timeout time.Duration
}

var _ goqmp.Monitor = (*GoQEMUMonitor)(nil)

// GoQEMU returns an adapter for go-qemu. Each Run is bounded by timeout; zero means no bound other
// than the connection ending.
func (m *Monitor) GoQEMU(timeout time.Duration) *GoQEMUMonitor {
	return &GoQEMUMonitor{m: m, timeout: timeout}
}

// Connect reports whether the connection is up. Dial has already negotiated capabilities, so there
// is nothing left to do; go-qemu's qemu.NewDomain does not call it, its users do.
func (g *GoQEMUMonitor) Connect() error {
	return g.m.Err()
}

// Disconnect closes the Monitor.
func (g *GoQEMUMonitor) Disconnect() error {
	return g.m.Close()
}

// Run sends a raw command such as {"execute":"query-status"} and returns QEMU's whole reply
// object, as go-qemu's callers expect: they decode its "return" member. Any "id" in command is
// replaced with the Monitor's own. The returned slice is the caller's to keep. An error reply is an
// *Error, not go-qemu's errors.New(desc).
func (g *GoQEMUMonitor) Run(command []byte) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(command, &obj); err != nil {
		return nil, fmt.Errorf("qmp: run: decode command: %w", err)
	}
	var cmd string
	if err := json.Unmarshal(obj["execute"], &cmd); err != nil || cmd == "" {
		return nil, errors.New("qmp: run: command has no execute member")
	}
	id := "vmfork-" + strconv.FormatUint(g.m.nextID.Add(1), 10)
	obj["id"], _ = json.Marshal(id)
	req, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("qmp: %s: encode command: %w", cmd, err)
	}

	ctx := context.Background() // go-qemu's Run has no context to honour; the timeout bounds it
	if g.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.timeout)
		defer cancel()
	}
	reply, err := g.m.roundTrip(ctx, cmd, id, req, nil)
	if err != nil {
		return nil, err
	}
	if err := decodeReply(cmd, reply.Return, reply.Error, nil); err != nil {
		return nil, err
	}
	return reply.raw, nil
}

// Events subscribes to events in go-qemu's form until ctx ends or the connection ends.
func (g *GoQEMUMonitor) Events(ctx context.Context) (<-chan goqmp.Event, error) {
	in, err := g.m.Events(ctx)
	if err != nil {
		return nil, err
	}
	out := make(chan goqmp.Event)
	go func() {
		defer close(out)
		for ev := range in {
			gev := goqmp.Event{Event: ev.Name}
			if len(ev.Data) > 0 {
				_ = json.Unmarshal(ev.Data, &gev.Data) // data is always an object in QEMU's schema
			}
			if !ev.Timestamp.IsZero() {
				gev.Timestamp.Seconds = ev.Timestamp.Unix()
				gev.Timestamp.Microseconds = int64(ev.Timestamp.Nanosecond()) / 1000
			}
			select {
			case out <- gev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
