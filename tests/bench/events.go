package bench

import (
	"io"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// eventHook notes the moments of some of vmfork's own log events: each fork
// child's "ready" (the ready-over-time curve of a burst: ForkResult has
// per-child durations only, each from the child's own start, and children
// wait for a slot), the end of the freeze, and each QMP command a child's
// QEMU gets (the phases of a fork child: QMP up, load done, cont).
type eventHook struct {
	mu     sync.Mutex
	events []event
	notify func() // called on each "child ready"
}

type event struct {
	at           time.Time
	msg, machine string
	cmd          string // qmp_cmd of a QMP command
}

// vmfork's log messages the harness times (fork.go, qmp/monitor.go).
const (
	readyMessage  = "child ready"
	frozenMessage = "source frozen"
	qmpMessage    = "qmp command"
)

func (h *eventHook) Levels() []logrus.Level {
	return []logrus.Level{logrus.InfoLevel, logrus.DebugLevel}
}

func (h *eventHook) Fire(en *logrus.Entry) error {
	if en.Message != readyMessage && en.Message != frozenMessage && en.Message != qmpMessage {
		return nil
	}
	ev := event{at: en.Time, msg: en.Message}
	ev.machine, _ = en.Data["machine"].(string)
	ev.cmd, _ = en.Data["qmp_cmd"].(string)
	h.mu.Lock()
	h.events = append(h.events, ev)
	n := h.notify
	h.mu.Unlock()
	if n != nil && ev.msg == readyMessage {
		n()
	}
	return nil
}

// reset forgets earlier events and calls notify on each new "child ready".
func (h *eventHook) reset(notify func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events, h.notify = nil, notify
}

// readySince returns the moments children were ready, in ms since t0.
func (h *eventHook) readySince(t0 time.Time) []float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []float64
	for _, ev := range h.events {
		if ev.msg == readyMessage {
			out = append(out, ms(ev.at.Sub(t0)))
		}
	}
	return out
}

// first returns the first event with msg (and, if not empty, machine and
// QMP command); ok is false if there is none.
func (h *eventHook) first(msg, machine, cmd string) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range h.events {
		if ev.msg == msg && (machine == "" || ev.machine == machine) && (cmd == "" || ev.cmd == cmd) {
			return ev.at, true
		}
	}
	return time.Time{}, false
}

// writerHook passes vmfork's log lines at the user's level to a writer; the
// logger itself runs at debug level for eventHook and writes nowhere.
type writerHook struct {
	w     io.Writer
	level logrus.Level
	f     logrus.Formatter
}

func (h writerHook) Levels() []logrus.Level { return logrus.AllLevels[:h.level+1] }

func (h writerHook) Fire(en *logrus.Entry) error {
	b, err := h.f.Format(en)
	if err != nil {
		return err
	}
	_, err = h.w.Write(b)
	return err
}
