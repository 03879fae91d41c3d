//go:build linux && amd64

package sharedmem

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// TestPlanDeltaChain: with Chain allowed, a tracked delta holds only the
// pages changed since the last delta (nothing copied before the pause) and
// names the deltas before it by links of its own; a discarded page is
// written with the base's bytes so that an older delta does not bring it
// back; a child applying the chain oldest first, and the compacted file,
// see exactly the instant; at maxDeltaDepth the chain is merged before the
// pause and starts again at one; a chain whose link is gone is not trusted.
func TestPlanDeltaChain(t *testing.T) {
	rootOnly(t)
	dir := t.TempDir()
	a := filepath.Join(dir, "a.ram")
	fillFile(t, a, 'a')
	h := startHelper(t, a, a)
	mon := &fakeMonitor{fd: h.fd}
	req := planRequest(h.cmd.Process.Pid, a, dir)
	p, err := Prepare(t.Context(), mon, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.InPause(t.Context(), &PauseWindow{}); err != nil {
		t.Fatal(err)
	}
	p.Cleanup(t.Context(), mon)
	track := filepath.Join(dir, "track.json")
	type made struct {
		p      *Plan
		copied int64
		delta  string
		chain  []string
	}
	// between, when set, runs once after the next fork's Prepare (the
	// copy before the pause) and before its pause: the source's writes then.
	var between func()
	fork := func(k int) made {
		t.Helper()
		r := req
		n := "t" + strconv.Itoa(k)
		r.Template, r.Temp = filepath.Join(dir, n+".ram"), filepath.Join(dir, "."+n+".ram.tmp")
		r.Delta, r.Base, r.Track, r.Chain = filepath.Join(dir, n+".delta"), filepath.Join(dir, n+".base.ram"), track, true
		p, err := Prepare(t.Context(), &fakeMonitor{}, r)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Cleanup(t.Context(), mon)
		if p.Mode != Delta {
			t.Fatalf("fork %d: mode %v, want delta", k, p.Mode)
		}
		if between != nil {
			between()
			between = nil
		}
		copied, err := p.InPause(t.Context(), &PauseWindow{})
		if err != nil {
			t.Fatal(err)
		}
		if p.TrackErr != nil {
			t.Errorf("fork %d: write tracking: %v", k, p.TrackErr)
		}
		return made{p, copied, r.Delta, p.Chain()}
	}
	// instant is what the source sees: page -> first byte ('a' elsewhere).
	instant := map[int]byte{}
	set := func(pg int, b byte) {
		h.ask("set " + strconv.Itoa(pg) + " " + strconv.Itoa(int(b)))
		instant[pg] = b
	}
	seesInstant := func(k int, m made) {
		t.Helper()
		want := bytes.Repeat([]byte{'a'}, helperPages*pageSize)
		for pg, b := range instant {
			want[pg*pageSize] = b
		}
		full := filepath.Join(dir, "full-"+strconv.Itoa(k)+".ram")
		if _, err := CompactChain(t.Context(), m.p.req.Base, append(append([]string{}, m.chain...), m.delta), full); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(full); !bytes.Equal(got, want) {
			for pg := 0; pg < helperPages; pg++ {
				if got[pg*pageSize] != want[pg*pageSize] {
					t.Errorf("fork %d: the chain compacted gives page %d = %d, want %d", k, pg, got[pg*pageSize], want[pg*pageSize])
				}
			}
		}
		os.Remove(full)
		c := filepath.Join(dir, "c"+strconv.Itoa(k)+".ram")
		fillFile(t, c, 'c')
		ch := startHelper(t, c, m.p.req.Base)
		if _, err := MapTemplateChain(t.Context(), &fakeMonitor{fd: ch.fd}, ch.cmd.Process.Pid, c, m.p.req.Base, append(append([]string{}, m.chain...), m.delta), helperPages*pageSize); err != nil {
			t.Fatal(err)
		}
		for pg := 0; pg < helperPages; pg++ {
			if got := ch.ask("get " + strconv.Itoa(pg)); got != strconv.Itoa(int(want[pg*pageSize])) {
				t.Errorf("fork %d: child page %d reads %s, want %d", k, pg, got, want[pg*pageSize])
			}
		}
	}
	held := func(f string) int64 {
		var st syscall.Stat_t
		syscall.Stat(f, &st)
		return st.Blocks * 512
	}

	set(2, 21)
	set(9, 22)
	// Nothing tracked yet: on the base alone, the private pages copied
	// before the pause with the writes tracked from just before (precopy),
	// none written since.
	m2 := fork(2)
	if !m2.p.tracked || len(m2.chain) != 0 || m2.p.Precopied != 2*pageSize || m2.copied != 0 {
		t.Errorf("fork 2: tracked %v, chain %v, %d bytes before the pause, %d in it; want tracked, none, 2 pages, 0", m2.p.tracked, m2.chain, m2.p.Precopied, m2.copied)
	}
	seesInstant(2, m2)
	set(2, 31)
	set(3, 32)
	h.ask("get 9")
	// Chained: the pages written since fork 2's instant (2 and 3) copied
	// into the empty delta before the pause, the one written after that
	// (3 again) in it.
	between = func() { set(3, 33) }
	m3 := fork(3)
	if !m3.p.tracked || m3.p.Precopied != 2*pageSize || m3.copied != pageSize || held(m3.delta) != 2*pageSize {
		t.Errorf("fork 3: tracked %v, %d bytes before the pause, %d in it, delta %d; want tracked, 2 pages, 1 page, 2 pages",
			m3.p.tracked, m3.p.Precopied, m3.copied, held(m3.delta))
	}
	if len(m3.chain) != 1 || inodeOf(t, m3.chain[0]) != inodeOf(t, m2.delta) {
		t.Errorf("fork 3: chain %v, want a link to %s", m3.chain, m2.delta)
	}
	seesInstant(3, m3)
	// Page 9 discarded: the base shows again, though fork 2's delta holds it.
	h.ask("drop 9")
	delete(instant, 9)
	set(5, 35)
	// Page 5, copied before the pause, is discarded before it: the delta
	// must show the base there too, not the copy.
	between = func() {
		h.ask("drop 5")
		delete(instant, 5)
		set(6, 46)
	}
	m4 := fork(4)
	if m4.p.Precopied != pageSize || m4.copied != 3*pageSize || len(m4.chain) != 2 {
		t.Errorf("fork 4: %d bytes before the pause, %d in it, chain of %d; want page 5 before, the discarded 9 and 5 and page 6 in, a chain of 2",
			m4.p.Precopied, m4.copied, len(m4.chain))
	}
	seesInstant(4, m4)
	// The templates of forks 2 and 3 go: fork 4's links keep its chain.
	for _, f := range []string{m2.delta, m3.delta, m3.chain[0]} {
		os.Remove(f)
	}
	set(6, 36)
	m5 := fork(5)
	if !m5.p.tracked || len(m5.chain) != 3 {
		t.Errorf("fork 5: tracked %v, chain of %d; want tracked on fork 4's chain of 2 and its delta", m5.p.tracked, len(m5.chain))
	}
	seesInstant(5, m5)
	// Up to the bound: each fork one link longer, then merged.
	k := 6
	for ; len(m5.chain)+1 < maxDeltaDepth; k++ {
		set(10+k%4, byte(k)) // rewritten: in several deltas of the chain
		m5 = fork(k)
	}
	if len(m5.chain) != maxDeltaDepth-1 {
		t.Fatalf("fork %d: chain of %d, want %d", k-1, len(m5.chain), maxDeltaDepth-1)
	}
	seesInstant(k-1, m5)
	set(50, 50)
	merged := fork(k)
	// The chain merged and the page written since its instant, both before
	// the pause (precopy): nothing written since, nothing in the pause.
	if !merged.p.tracked || len(merged.chain) != 0 || merged.p.Precopied <= pageSize || merged.copied != 0 {
		t.Errorf("fork %d past the bound: tracked %v, chain %d, %d before, %d in the pause; want tracked, merged and page 50 before the pause, none in it",
			k, merged.p.tracked, len(merged.chain), merged.p.Precopied, merged.copied)
	}
	seesInstant(k, merged)
	between = func() { set(51, 51) }
	next := fork(k + 1)
	if len(next.chain) != 1 || next.copied != pageSize {
		t.Errorf("fork %d: chain %d, %d bytes; want a chain of 1 again, 1 page", k+1, len(next.chain), next.copied)
	}
	seesInstant(k+1, next)
	// A link of the chain gone: not trusted; all private pages, copied
	// before the pause with the writes tracked from just before.
	os.Remove(next.chain[0])
	set(52, 52)
	last := fork(k + 2)
	if !last.p.tracked || len(last.chain) != 0 || last.p.Precopied != held(last.delta) || last.copied != 0 {
		t.Errorf("fork %d after a lost link: tracked %v, chain %d, %d bytes before the pause (delta %d), %d in it; want all private pages before, none in",
			k+2, last.p.tracked, len(last.chain), last.p.Precopied, held(last.delta), last.copied)
	}
	seesInstant(k+2, last)
}

// TestPlanDeltaBurst: a delta is made for one child, but not for a burst
// whose children would together hold more than the base (Children).
func TestPlanDeltaBurst(t *testing.T) {
	rootOnly(t)
	dir := t.TempDir()
	a := filepath.Join(dir, "a.ram")
	fillFile(t, a, 'a')
	h := startHelper(t, a, a)
	mon := &fakeMonitor{fd: h.fd}
	req := planRequest(h.cmd.Process.Pid, a, dir)
	p, err := Prepare(t.Context(), mon, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.InPause(t.Context(), &PauseWindow{}); err != nil {
		t.Fatal(err)
	}
	p.Cleanup(t.Context(), mon)
	for i := 0; i < 5; i++ {
		h.ask("set " + strconv.Itoa(i) + " 7")
	}
	for _, c := range []struct {
		children int
		want     Mode
	}{{1, Delta}, {12, Delta}, {13, Diff}} { // 5 pages x 13 > 64
		r := req
		r.Template, r.Temp = filepath.Join(dir, "b.ram"), filepath.Join(dir, ".b.ram.tmp")
		r.Delta, r.Base, r.Children = filepath.Join(dir, "b.delta"), filepath.Join(dir, "b.base.ram"), c.children
		p, err := Prepare(t.Context(), mon, r)
		if err != nil {
			t.Fatal(err)
		}
		if p.Mode != c.want {
			t.Errorf("%d children, 5 of %d pages private: mode %v, want %v", c.children, helperPages, p.Mode, c.want)
		}
		p.Cleanup(t.Context(), mon)
	}
}

// TestTrackRemapClosesOldUFFD: a remap of the source (a full copy's
// freeze) replaces the tracked mapping; the next delta registers its
// writes again and closes the old registration's descriptor in the
// process, so that remaps leave no userfaultfd behind.
func TestTrackRemapClosesOldUFFD(t *testing.T) {
	rootOnly(t)
	dir := t.TempDir()
	a := filepath.Join(dir, "a.ram")
	fillFile(t, a, 'a')
	h := startHelper(t, a, a)
	pid := h.cmd.Process.Pid
	mon := &fakeMonitor{fd: h.fd}
	req := planRequest(pid, a, dir)
	p, err := Prepare(t.Context(), mon, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.InPause(t.Context(), &PauseWindow{}); err != nil {
		t.Fatal(err)
	}
	p.Cleanup(t.Context(), mon)
	track := filepath.Join(dir, "track.json")
	uffds := func() int {
		ents, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
		n := 0
		for _, e := range ents {
			if fd, err := strconv.Atoi(e.Name()); err == nil && isUFFD(pid, fd) {
				n++
			}
		}
		return n
	}
	fork := func(k int, children int) Mode {
		t.Helper()
		r := req
		n := "t" + strconv.Itoa(k)
		r.Template, r.Temp = filepath.Join(dir, n+".ram"), filepath.Join(dir, "."+n+".ram.tmp")
		r.Delta, r.Base, r.Track, r.Chain, r.Children = filepath.Join(dir, n+".delta"), filepath.Join(dir, n+".base.ram"), track, true, children
		r.Own = filepath.Join(dir, "own"+strconv.Itoa(k)+".ram")
		p, err := Prepare(t.Context(), &fakeMonitor{fd: h.fd}, r)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Cleanup(t.Context(), mon)
		if _, err := p.InPause(t.Context(), &PauseWindow{}); err != nil {
			t.Fatal(err)
		}
		return p.Mode
	}
	h.ask("set 1 1")
	if m := fork(2, 1); m != Delta || uffds() != 1 {
		t.Fatalf("fork 2: mode %v, %d userfaultfds; want delta, 1", m, uffds())
	}
	h.ask("set 2 2")
	if m := fork(3, helperPages); m != Diff { // a burst: a full copy, the source remapped
		t.Fatalf("fork 3: mode %v, want diff", m)
	}
	h.ask("set 3 3")
	if m := fork(4, 1); m != Delta {
		t.Fatalf("fork 4: mode %v, want delta", m)
	}
	if n := uffds(); n != 1 {
		t.Errorf("%d userfaultfds open in the process after a remap and a new registration, want 1", n)
	}
}
