package customize

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The clock step. A child's clock goes on from its template's freeze, so
// it lags by the template's age.
//
// Why a child could stay 1.9 s off after its clock was set (libvirt, slow
// starts): the step sent guest-set-time an absolute time, host time plus
// half the round trip of its first read. That first read is the slowest of
// all on a slow start: libvirt's agent calls (virDomainQemuAgentCommand)
// first sync with the agent (guest-sync, which waits for the agent to
// answer), and an agent a slow start keeps busy answers late. A first read
// that took 3.8 s made the step set the guest 1.9 s ahead, while the set
// itself arrived at once; the check then found the guest 1.9 s ahead. Also,
// qemu-ga 7.2 runs /sbin/hwclock -w after setting the time, and util-linux's
// hwclock waits for the RTC's next second boundary (up to 1 s, the 579 ms
// observed on Debian), during which the call does not return.
//
// So the step moves the guest's clock by the offset it measured, relative to
// the guest's own clock when the command runs (date -s "+N seconds", GNU
// date), which no delivery delay changes, and never writes the RTC, which
// QEMU keeps at host time. Where date cannot do that (busybox), it falls
// back to guest-set-time, whose hwclock does not wait there. Offsets are
// measured from the read with the shortest round trip of a few, and the
// step sets, checks and sets again until the clock is within
// clockTolerance or its timeout ends: a guest whose vCPUs sat stopped can
// also move on after the first setting.
const (
	clockTolerance = 50 * time.Millisecond
	clockSamples   = 3
	clockAttempts  = 4
	// quickRoundTrip is a read whose round trip is short enough not to
	// bother taking more samples.
	quickRoundTrip = 100 * time.Millisecond
)

// ClockStep steps the guest clock to host time; its detail names the
// mechanism (date or guest-set-time) and the offset left.
//
// A guest whose facts say its date is GNU's has its date -s run as a part
// of the batch after the step (batch.go), not as a guest command of its
// own: date's relative form applies when it runs, whenever that is. The
// check, and any setting again, follows the batch.
func ClockStep() Step {
	return Step{Name: StepClock, Timeout: DefaultTimeout, Fn: stepClock, Parts: partsClock}
}

// dateScript moves the clock by $1 with GNU date; it prints "failed" when
// date could not, for the host to fall back to guest-set-time.
const dateScript = `if ! date -u -s "$1" >/dev/null 2>&1; then echo failed; fi
return 0`

func partsClock(ctx context.Context, env *Env) ([]*Part, error) {
	if env.Facts == nil || env.Facts.Date != "gnu" {
		return nil, stepClock(ctx, env)
	}
	first, err := clockOffset(ctx, env)
	if err != nil {
		return nil, err
	}
	if first.Abs() <= clockTolerance {
		env.Detailf("within %+dms of host time; left alone", first.Milliseconds())
		return nil, nil
	}
	return []*Part{{Script: dateScript, Args: []string{relative(first)}, Inline: true, Done: func(env *Env, out string) error {
		// After the batch, under a bound of its own: the step's context
		// ended with its host side.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultTimeout)
		defer cancel()
		ran := strings.TrimSpace(out) != "failed"
		off, rtt, err := clockSample(cctx, env)
		if err != nil {
			return err
		}
		if ran && off.Abs() <= clockTolerance+rtt/2 {
			env.Detailf("stepped %+.3fs by date -s, now %+dms from host (1 attempt)", -first.Seconds(), off.Milliseconds())
			return nil
		}
		return setClock(cctx, env, first, off, ran)
	}}}, nil
}

// clockOffset returns how far the guest's clock is ahead of the host's,
// from the sample with the shortest round trip.
func clockOffset(ctx context.Context, env *Env) (time.Duration, error) {
	off, _, err := clockSample(ctx, env)
	return off, err
}

// clockSample returns the offset and the round trip of the read it comes
// from: the offset is known to within half of that.
func clockSample(ctx context.Context, env *Env) (time.Duration, time.Duration, error) {
	var best, rtt time.Duration
	for i := range clockSamples {
		t0 := env.now()
		g, err := env.Agent.GetTime(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("read guest clock: %w", err)
		}
		t1 := env.now()
		d := t1.Sub(t0)
		if i == 0 || d < rtt {
			best, rtt = g.Sub(t0.Add(d/2)), d
		}
		if rtt <= quickRoundTrip {
			break
		}
	}
	return best, rtt, nil
}

func stepClock(ctx context.Context, env *Env) error {
	first, err := clockOffset(ctx, env)
	if err != nil {
		return err
	}
	if first.Abs() <= clockTolerance {
		env.Detailf("within %+dms of host time; left alone", first.Milliseconds())
		return nil
	}
	var useDate bool
	if env.Facts != nil && env.Facts.Date != "" {
		useDate = env.Facts.Date == "gnu"
	} else {
		useDate = hasGNUDate(ctx, env.Agent)
	}
	return setClock(ctx, env, first, first, useDate)
}

// setClock sets the guest's clock, off ahead of the host's (first at the
// step's start), and checks it, until it is within clockTolerance or the
// attempts or ctx end. useDate picks GNU date's relative form over
// guest-set-time.
func setClock(ctx context.Context, env *Env, first, off time.Duration, useDate bool) error {
	how := ""
	for attempt := 1; attempt <= clockAttempts; attempt++ {
		var err error
		if useDate {
			if err = dateStep(ctx, env.Agent, off); err != nil {
				useDate = false // no GNU date: guest-set-time from now on
				continue
			}
			how = "date -s"
		} else {
			// The guest sets what it is sent when it arrives, a few
			// milliseconds later; the check below measures what is left.
			t := env.now()
			if err = env.Agent.SetTime(ctx, &t); err != nil {
				return fmt.Errorf("set guest clock: %w", err)
			}
			how = "guest-set-time"
		}
		var rtt time.Duration
		if off, rtt, err = clockSample(ctx, env); err != nil {
			return err
		}
		// A busy guest answers slowly, and no reading is better than half
		// its round trip: setting again could not do better.
		if off.Abs() <= clockTolerance+rtt/2 {
			env.Detailf("stepped %+.3fs by %s, now %+dms from host (%d %s)", -first.Seconds(), how, off.Milliseconds(), attempt, plural(attempt, "attempt"))
			return nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	if off.Abs() <= maxClockOffset {
		env.Detailf("stepped %+.3fs by %s, now %+dms from host", -first.Seconds(), how, off.Milliseconds())
		return nil
	}
	return fmt.Errorf("guest clock is still %v off host time after setting it (%s)", off.Round(time.Millisecond), how)
}

// hasGNUDate guesses from /etc/os-release (read with the agent's file
// calls, no process) whether the guest's date is GNU's, which takes relative
// times, and its hwclock util-linux's, which waits for a second boundary: a
// distribution's. A busybox system (Alpine, the test guest) has neither.
// A wrong guess costs one failed date: the step then falls back.
func hasGNUDate(ctx context.Context, a Agent) bool {
	b, err := a.ReadFile(ctx, "/etc/os-release")
	if err != nil {
		return false
	}
	s := strings.ToLower(string(b))
	return !strings.Contains(s, "busybox") && !strings.Contains(s, "id=alpine")
}

// dateStep moves the guest's clock back by off with GNU date's relative
// form, which applies to the guest's clock when date runs.
func dateStep(ctx context.Context, a Agent, off time.Duration) error {
	st, err := runGuest(ctx, a, "/bin/date", []string{"-u", "-s", relative(off)}, nil)
	if err != nil {
		return err
	}
	return exitErr("date -s", st)
}

// relative is GNU date's relative time that undoes an offset off.
func relative(off time.Duration) string {
	return fmt.Sprintf("%+.9f seconds", -off.Seconds())
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
