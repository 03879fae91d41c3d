package bench

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
)

func TestGapsIn(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(msec ...int) []time.Time {
		var out []time.Time
		for _, m := range msec {
			out = append(out, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return out
	}
	// Replies every 2 ms, one stall of 40 ms ending at 50, one of 10 ms
	// ending at 2 ms after the window (left out).
	replies := at(0, 2, 4, 6, 8, 10, 50, 52, 54, 56, 66)
	g := gapsIn(replies, t0.Add(3*time.Millisecond), t0.Add(60*time.Millisecond))
	if g.Replies != 8 || g.MaxGapMS != 40 || g.MaxGapEndMS != 47 || g.MedianGapMS != 2 || g.P99GapMS != 40 {
		t.Errorf("gapsIn = %+v, want 8 gaps, longest 40 ms ending 47 ms into the window, median 2", g)
	}
	// The gap that spans the window's start is the window's.
	g = gapsIn(replies, t0.Add(30*time.Millisecond), t0.Add(53*time.Millisecond))
	if g.Replies != 2 || g.MaxGapMS != 40 {
		t.Errorf("gapsIn from inside a stall = %+v, want 2 gaps, longest 40", g)
	}
	if g := gapsIn(nil, t0, t0.Add(time.Second)); g.Replies != 0 || g.MaxGapMS != 0 {
		t.Errorf("gapsIn of no replies = %+v, want zero", g)
	}
	if d := gapAcross(replies, t0.Add(20*time.Millisecond), t0.Add(21*time.Millisecond)); d != 40 {
		t.Errorf("gapAcross the stall = %v, want 40", d)
	}
	if d := gapAcross(replies, t0.Add(51*time.Millisecond), t0.Add(62*time.Millisecond)); d != 10 {
		t.Errorf("gapAcross 51-62 ms = %v, want 10 (the longest gap overlapping it)", d)
	}
}

// echoServer echoes each byte back; after stallAfter bytes it holds one
// byte for stall first. It returns its address.
func echoServer(t *testing.T, stallAfter int64, stall time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				b := []byte{0}
				for {
					if _, err := io.ReadFull(conn, b); err != nil {
						return
					}
					if n.Add(1) == stallAfter {
						time.Sleep(stall)
					}
					if _, err := conn.Write(b); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func TestEchoClientSeesAStall(t *testing.T) {
	addr := echoServer(t, 20, 150*time.Millisecond)
	t0 := time.Now()
	c, err := dialEcho(t.Context(), addr, 2*time.Millisecond, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		replies, err := c.window()
		if err != nil {
			t.Fatal(err)
		}
		if len(replies) >= 60 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d replies after 10 s, want 60", len(replies))
		}
		time.Sleep(20 * time.Millisecond)
	}
	replies, _ := c.window()
	g := gapsIn(replies, t0, time.Now())
	if g.MaxGapMS < 150 || g.MaxGapMS > 1000 {
		t.Errorf("longest gap %.1f ms, want the server's 150 ms stall", g.MaxGapMS)
	}
	if g.MedianGapMS < 1.5 || g.MedianGapMS > 50 {
		t.Errorf("median gap %.1f ms, want about the 2 ms interval", g.MedianGapMS)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := c.window(); err != nil {
		t.Errorf("window after Close: %v, want the replies", err)
	}
}

func TestEchoClientReportsALostService(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Echo the dial's check byte and three more, then hang up.
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		b := make([]byte, 1)
		for range 4 {
			if _, err := io.ReadFull(conn, b); err != nil {
				break
			}
			conn.Write(b)
		}
		conn.Close()
	}()
	c, err := dialEcho(t.Context(), ln.Addr().String(), time.Millisecond, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for c.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := c.window(); err == nil {
		t.Fatal("window after the service hung up: no error")
	}
}

func TestDialEchoGivesUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: every dial is refused
	_, err = dialEcho(t.Context(), addr, time.Millisecond, 300*time.Millisecond)
	if err == nil {
		t.Fatal("dialEcho to a closed port: no error")
	}
}

func TestStallUseFor(t *testing.T) {
	o := StallOptions{MemoryMiB: []int{512, 4096}, GuestUse: []GuestUse{{}, {MiB: 3072}}}
	for i, want := range []int{0, 3072} {
		if got, err := o.useFor(i, o.MemoryMiB[i]); err != nil || got != want {
			t.Errorf("useFor(%d) = %d, %v; want %d", i, got, err, want)
		}
	}
	o.GuestUse = []GuestUse{{}, {}, {}}
	if _, err := o.useFor(0, 512); !errors.Is(err, vmfork.ErrInvalid) {
		t.Errorf("three uses for two sizes: %v, want ErrInvalid", err)
	}
	var d StallOptions
	d.defaults()
	if len(d.MemoryMiB) != 2 || d.GuestUse[1].MiB != 3072 || d.Rounds != 3 || d.Interval != 2*time.Millisecond {
		t.Errorf("defaults = %+v", d)
	}
}

func TestStallSummaryAndTargets(t *testing.T) {
	sz := StallSize{MemoryMiB: 4096, GuestUseMiB: 3072,
		Rounds: []StallRound{
			{Round: 1, Quiet: Gaps{MaxGapMS: 5}, Floor: Gaps{MaxGapMS: 20}, FloorPauseMS: 15, Fork: Gaps{MaxGapMS: 40}, ForkAcrossPauseMS: 35, CloneMS: 900},
			{Round: 2, Quiet: Gaps{MaxGapMS: 7}, Floor: Gaps{MaxGapMS: 24}, FloorPauseMS: 17, Fork: Gaps{MaxGapMS: 28}, ForkAcrossPauseMS: 26, CloneMS: 1100},
		},
		Libvirt: []Sample{
			{ReadyMS: 9000, WallMS: 30000, Phases: Phases{SaveMS: 11000, RestoreMS: 8000, AgentMS: 1000, CopyMS: 10000}},
			{ReadyMS: 0}, // failed: left out
		},
	}
	sz.summarize()
	if sz.FloorMaxGapMS != 22 || sz.ForkMaxGapMS != 34 || sz.CloneMS != 1000 || sz.SaveRestoreMS != 20000 || sz.WithCopyMS != 30000 {
		t.Fatalf("summary = %+v", sz)
	}
	met := map[string]bool{}
	for _, r := range sz.Ratios {
		if r.Met != nil {
			met[r.Name] = *r.Met
		}
	}
	if len(met) != 2 || met["client stall: fork ÷ floor (longest gap between replies, same client)"] ||
		!met["whole clone: virsh save + restore (to agent) ÷ vmfork fork (to first child READY)"] {
		t.Errorf("targets = %v, want the stall (34/22) missed and the clone (20x) met", met)
	}
}
