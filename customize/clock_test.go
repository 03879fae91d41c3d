package customize

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// clockGuest is a guest whose clock runs offset from a fake host clock, and
// whose agent answers its first read slowly, as on a slow libvirt start
// (the agent sync before the first command).
type clockGuest struct {
	*fakeAgent
	mu        sync.Mutex
	host      time.Time
	offset    time.Duration // guest - host
	firstRead time.Duration // the first GetTime's round trip
	reads     int
	hasDate   bool // GNU date with relative times (a distribution)
	sets      int
}

func (g *clockGuest) now() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.host = g.host.Add(time.Millisecond) // every look at the clock takes a little
	return g.host
}

func (g *clockGuest) advance(d time.Duration) {
	g.mu.Lock()
	g.host = g.host.Add(d)
	g.mu.Unlock()
}

func (g *clockGuest) GetTime(context.Context) (time.Time, error) {
	g.mu.Lock()
	g.reads++
	slow := g.reads == 1
	g.mu.Unlock()
	if slow {
		g.advance(g.firstRead / 2)
	}
	g.mu.Lock()
	t := g.host.Add(g.offset)
	g.mu.Unlock()
	if slow {
		g.advance(g.firstRead / 2)
	}
	return t, nil
}

func (g *clockGuest) SetTime(_ context.Context, t *time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sets++
	g.offset = t.Sub(g.host)
	return nil
}

func (g *clockGuest) ReadFile(_ context.Context, path string) ([]byte, error) {
	if path == "/etc/os-release" && g.hasDate {
		return []byte("ID=debian\n"), nil
	}
	return nil, errors.New("no such file")
}

func (g *clockGuest) Exec(ctx context.Context, req qmp.ExecRequest) (int, error) {
	if req.Path != "/bin/date" {
		return g.fakeAgent.Exec(ctx, req)
	}
	st := qmp.ExecStatus{Exited: true, ExitCode: 1, Stderr: []byte("date: invalid date")}
	if g.hasDate && len(req.Args) == 3 && req.Args[1] == "-s" {
		if secs, err := strconv.ParseFloat(strings.TrimSuffix(req.Args[2], " seconds"), 64); err == nil {
			g.mu.Lock()
			g.offset += time.Duration(secs * float64(time.Second))
			g.mu.Unlock()
			st = qmp.ExecStatus{Exited: true}
		}
	}
	g.fakeAgent.mu.Lock()
	defer g.fakeAgent.mu.Unlock()
	g.fakeAgent.status = append(g.fakeAgent.status, st)
	return len(g.fakeAgent.status), nil
}

// TestClockSlowFirstRead: a first read that takes 3.8 s once made the step
// set the guest 1.9 s ahead (half that round trip). Both mechanisms now
// leave it within the tolerance, and the detail names the one used.
func TestClockSlowFirstRead(t *testing.T) {
	for _, hasDate := range []bool{true, false} {
		g := &clockGuest{fakeAgent: newFakeAgent(), host: time.Unix(5000, 0), offset: -90 * time.Second, firstRead: 3800 * time.Millisecond, hasDate: hasDate}
		res, err := Run(t.Context(), NewChain(ClockStep()), &Env{Agent: g, Now: g.now})
		if err != nil {
			t.Fatalf("date %v: %v", hasDate, err)
		}
		if g.offset.Abs() > clockTolerance {
			t.Errorf("date %v: guest left %v off host time", hasDate, g.offset)
		}
		want := "by guest-set-time"
		if hasDate {
			want = "by date -s"
		}
		if d := res.Steps[0].Detail; !strings.HasPrefix(d, "stepped +90.0") || !strings.Contains(d, want) {
			t.Errorf("date %v: detail %q, want it to say +90 s %s", hasDate, d, want)
		}
		if hasDate && g.sets != 0 {
			t.Errorf("guest-set-time (and its hwclock -w) used %d times where date can step the clock", g.sets)
		}
	}
	// A clock already right is left alone.
	g := &clockGuest{fakeAgent: newFakeAgent(), host: time.Unix(5000, 0), offset: 3 * time.Millisecond}
	res, err := Run(t.Context(), NewChain(ClockStep()), &Env{Agent: g, Now: g.now})
	if err != nil || !strings.Contains(res.Steps[0].Detail, "left alone") || g.sets != 0 {
		t.Errorf("right clock: %v, %+v, %d sets", err, res.Steps, g.sets)
	}
}
