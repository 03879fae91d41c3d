package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// The client of a source: a host process exchanging one byte at a time with
// an echo service in the guest, through a port forward of QEMU's user
// network, every few milliseconds. It notes when each byte came back; the
// longest gap between two replies is the stall that client saw, whatever
// caused it (the pause, the page faults after it, a child starting on the
// same cores). It runs in the harness's own process (a goroutine), so that
// its clock is the one that timed the fork.

// echoLimit bounds one exchange: a reply that takes longer means the
// service or the forward is gone, not a stall worth measuring.
const echoLimit = 60 * time.Second

// echoClient is one connection to an echo service and the moments its
// replies arrived.
type echoClient struct {
	conn     net.Conn
	interval time.Duration

	mu      sync.Mutex
	replies []time.Time
	err     error

	stop chan struct{}
	done chan struct{}
}

// dialEcho connects to the echo service at addr and starts exchanging a
// byte every interval. It retries for up to limit: the forward accepts a
// connection before the guest's service listens, and then closes it. The
// caller must Close the client.
func dialEcho(ctx context.Context, addr string, interval, limit time.Duration) (*echoClient, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		conn, err := tryEcho(ctx, addr)
		if err == nil {
			c := &echoClient{conn: conn, interval: interval, stop: make(chan struct{}), done: make(chan struct{})}
			go c.run()
			return c, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("echo service at %s does not answer: %w (last error: %v)", addr, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tryEcho connects and checks that one byte comes back.
func tryEcho(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	b := []byte{0xa5}
	if _, err = conn.Write(b); err == nil {
		_, err = io.ReadFull(conn, b)
	}
	if err == nil && b[0] != 0xa5 {
		err = fmt.Errorf("echo service sent %#x for 0xa5", b[0])
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// run exchanges a byte every interval until Close. Each exchange starts at
// its slot or, when the previous reply came late, at once: a client does not
// burst to catch up after a stall.
func (c *echoClient) run() {
	defer close(c.done)
	b := []byte{0}
	next := time.Now()
	for i := 0; ; i++ {
		select {
		case <-c.stop:
			return
		default:
		}
		want := byte(i)
		c.conn.SetDeadline(time.Now().Add(echoLimit))
		b[0] = want
		_, err := c.conn.Write(b)
		if err == nil {
			_, err = io.ReadFull(c.conn, b)
		}
		now := time.Now()
		if err == nil && b[0] != want {
			err = fmt.Errorf("echo service sent %#x for %#x: bytes lost or reordered", b[0], want)
		}
		c.mu.Lock()
		if err != nil {
			c.err = err
		} else {
			c.replies = append(c.replies, now)
		}
		c.mu.Unlock()
		if err != nil {
			return
		}
		if next = next.Add(c.interval); next.Before(now) {
			next = now
		}
		select {
		case <-c.stop:
			return
		case <-time.After(time.Until(next)):
		}
	}
}

// Err is why the client stopped, if it did.
func (c *echoClient) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close stops the exchanges and the connection. It is safe to call twice.
func (c *echoClient) Close() error {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	err := c.conn.Close()
	<-c.done
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// window returns the client's replies so far, or why it stopped.
func (c *echoClient) window() ([]time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		select {
		case <-c.stop:
		default:
			return nil, fmt.Errorf("echo client: %w", c.err)
		}
	}
	return slices.Clone(c.replies), nil
}

// Gaps describes the time between consecutive replies in a window.
type Gaps struct {
	Replies     int     `json:"replies"`
	MaxGapMS    float64 `json:"max_gap_ms"`
	P99GapMS    float64 `json:"p99_gap_ms"`
	MedianGapMS float64 `json:"median_gap_ms"`
	// MaxGapEndMS is when the longest gap ended, in ms after the window
	// began.
	MaxGapEndMS float64 `json:"max_gap_end_ms"`
}

// gapsIn returns the gaps between replies that end in (from, to], the first
// counted from the last reply before from: a stall that began just before
// the window is the window's.
func gapsIn(replies []time.Time, from, to time.Time) Gaps {
	var g Gaps
	var gaps []float64
	for i := 1; i < len(replies); i++ {
		end := replies[i]
		if !end.After(from) || end.After(to) {
			continue
		}
		d := ms(end.Sub(replies[i-1]))
		gaps = append(gaps, d)
		if d > g.MaxGapMS {
			g.MaxGapMS, g.MaxGapEndMS = d, ms(end.Sub(from))
		}
	}
	g.Replies = len(gaps)
	g.P99GapMS, g.MedianGapMS = Percentile(gaps, 99), Median(gaps)
	return g
}

// gapAcross returns the longest gap between replies that overlaps [a, b]:
// the stall a known interval (a pause) caused. 0 when no gap overlaps it.
func gapAcross(replies []time.Time, a, b time.Time) float64 {
	var longest float64
	for i := 1; i < len(replies); i++ {
		if replies[i].Before(a) || replies[i-1].After(b) {
			continue
		}
		longest = max(longest, ms(replies[i].Sub(replies[i-1])))
	}
	return longest
}
