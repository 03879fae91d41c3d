package qmp

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// Event names this project waits for (qapi/run-state.json, qapi/migration.json, qapi/qdev.json).
const (
	EventStop          = "STOP"
	EventResume        = "RESUME"
	EventShutdown      = "SHUTDOWN"
	EventMigration     = "MIGRATION" // only with the "events" migration capability, except incoming "setup"
	EventDeviceDeleted = "DEVICE_DELETED"
)

// Event is an asynchronous QMP event.
type Event struct {
	Name      string          // such as "STOP" or "MIGRATION"
	Data      json.RawMessage // the event's "data" member, nil when QEMU sent none
	Timestamp time.Time       // QEMU's host clock when it emitted the event
}

type timestamp struct {
	Seconds      int64 `json:"seconds"`
	Microseconds int64 `json:"microseconds"`
}

func newEvent(msg message) Event {
	ev := Event{Name: msg.Event, Data: msg.Data}
	if ts := msg.Timestamp; ts != nil {
		ev.Timestamp = time.Unix(ts.Seconds, ts.Microseconds*int64(time.Microsecond))
	}
	return ev
}

// subscriber is one Events caller. The reader appends to queue and never blocks; a pump goroutine
// moves the queue to the caller's channel at the caller's pace.
type subscriber struct {
	mu    sync.Mutex
	queue []Event
	wake  chan struct{} // capacity 1: "queue may be non-empty"
}

// Events subscribes to every event QEMU sends from now until ctx ends or the connection ends; then
// the channel is closed (after the events already queued when the connection ended). Subscribe
// before sending the command whose event you wait for, or the event may come first.
//
// Events are queued without bound so that a slow subscriber never delays replies or other
// subscribers (see the package documentation); end ctx as soon as you stop reading.
func (m *Monitor) Events(ctx context.Context) (<-chan Event, error) {
	s := &subscriber{wake: make(chan struct{}, 1)}
	m.mu.Lock()
	if m.err != nil {
		err := m.err
		m.mu.Unlock()
		return nil, fmt.Errorf("qmp: events: %w", err)
	}
	m.subs[s] = struct{}{}
	m.mu.Unlock()

	out := make(chan Event)
	go m.pump(ctx, s, out)
	return out, nil
}

// publish queues ev for every subscriber. It runs on the reader goroutine and never blocks on one.
func (m *Monitor) publish(ev Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for s := range m.subs {
		s.mu.Lock()
		s.queue = append(s.queue, ev)
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

func (m *Monitor) pump(ctx context.Context, s *subscriber, out chan<- Event) {
	defer close(out)
	defer func() {
		m.mu.Lock()
		delete(m.subs, s)
		m.mu.Unlock()
	}()
	send := func(batch []Event) bool {
		for _, ev := range batch {
			select {
			case out <- ev:
			case <-ctx.Done():
				return false
			}
		}
		return true
	}
	for {
		batch := s.take()
		if !send(batch) {
			return
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return
		case <-m.done:
			// The reader has exited, so nothing more is queued; flush what is left.
			send(s.take())
			return
		}
	}
}

func (s *subscriber) take() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	batch := s.queue
	s.queue = nil
	return batch
}

// WaitEvent reads events until one named name arrives and returns it. events comes from
// Monitor.Events, called before the command that triggers the event. It fails when ctx ends or
// when the channel closes, which happens when QEMU exits.
func WaitEvent(ctx context.Context, events <-chan Event, name string) (Event, error) {
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return Event{}, fmt.Errorf("qmp: wait for event %s: %w", name, ErrClosed)
			}
			if ev.Name == name {
				return ev, nil
			}
		case <-ctx.Done():
			return Event{}, fmt.Errorf("qmp: wait for event %s: %w", name, ctx.Err())
		}
	}
}
