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

// TestPlanDelta: a process on a frozen file that a template still holds is
// frozen as a delta (the file as base under a second name, and a sparse file
// of its private pages), is not remapped, and a child mapped onto the base
// with the delta applied sees exactly the instant, as does the compacted
// full file; the base is never written.
func TestPlanDelta(t *testing.T) {
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
	// The first template (t.ram) keeps a's file: the next freeze may not
	// write it in place.
	h.ask("set 2 21")
	h.ask("set 9 22")
	req2 := req
	req2.Template, req2.Temp = filepath.Join(dir, "t2.ram"), filepath.Join(dir, ".t2.ram.tmp")
	req2.Delta, req2.Base = filepath.Join(dir, "t2.delta"), filepath.Join(dir, "t2.base.ram")
	mon2 := &fakeMonitor{}
	p2, err := Prepare(t.Context(), mon2, req2)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Cleanup(t.Context(), mon2)
	if p2.Mode != Delta || p2.Precopied != 0 {
		t.Fatalf("second plan: mode %v, %d bytes precopied; want delta, 0", p2.Mode, p2.Precopied)
	}
	if len(mon2.cmds) != 0 {
		t.Errorf("a delta plan ran QMP commands %v; QEMU needs nothing", mon2.cmds)
	}
	n, err := p2.InPause(t.Context(), &PauseWindow{})
	if err != nil || n != 2*pageSize {
		t.Fatalf("InPause = %d, %v; want the 2 private pages", n, err)
	}
	p2.Cleanup(t.Context(), mon2)
	if _, err := os.Stat(req2.Template); !os.IsNotExist(err) {
		t.Errorf("a delta freeze made the full template file %s (%v)", req2.Template, err)
	}
	if inodeOf(t, req2.Base) != inodeOf(t, a) {
		t.Errorf("the delta's base is not the file the process maps")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(req2.Delta, &st); err != nil || st.Blocks*512 != 2*pageSize {
		t.Errorf("delta holds %d bytes (%v), want the 2 private pages", st.Blocks*512, err)
	}
	// Not remapped: the process still sees its writes, and writes on.
	h.ask("set 3 23")
	if got := h.ask("get 9"); got != "22" {
		t.Errorf("source page 9 reads %s after the delta freeze, want 22", got)
	}

	// A child: a fresh shared file, remapped onto the base, delta applied.
	c := filepath.Join(dir, "c.ram")
	fillFile(t, c, 'c')
	ch := startHelper(t, c, req2.Base)
	as, err := MapTemplateDelta(t.Context(), &fakeMonitor{fd: ch.fd}, ch.cmd.Process.Pid, c, req2.Base, req2.Delta, helperPages*pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if as.Bytes != 2*pageSize {
		t.Errorf("applied %d bytes, want 2 pages", as.Bytes)
	}
	for page, want := range map[int]int{2: 21, 9: 22, 3: 'a', 0: 'a'} {
		if got := ch.ask("get " + strconv.Itoa(page)); got != strconv.Itoa(want) {
			t.Errorf("child page %d reads %s, want %d (the instant)", page, got, want)
		}
	}
	ch.ask("set 4 24")
	if data, _ := os.ReadFile(a); data[2*pageSize] != 'a' || data[4*pageSize] != 'a' {
		t.Errorf("the base was written: pages 2, 4 = %d, %d", data[2*pageSize], data[4*pageSize])
	}

	full := filepath.Join(dir, "t2.ram")
	if _, err := CompactDelta(t.Context(), req2.Base, req2.Delta, full); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{'a'}, helperPages*pageSize)
	want[2*pageSize], want[9*pageSize] = 21, 22
	if got, _ := os.ReadFile(full); !bytes.Equal(got, want) {
		t.Errorf("the compacted file is not base + delta")
	}
}

// TestPlanDeltaTooLarge: private pages above the share make a full copy
// (which resets the source's private pages), not a delta.
func TestPlanDeltaTooLarge(t *testing.T) {
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
	for i := 0; i < helperPages/maxDeltaShare+1; i++ {
		h.ask("set " + strconv.Itoa(i) + " 7")
	}
	req2 := req
	req2.Template, req2.Temp = filepath.Join(dir, "t2.ram"), filepath.Join(dir, ".t2.ram.tmp")
	req2.Delta, req2.Base, req2.Chain = filepath.Join(dir, "t2.delta"), filepath.Join(dir, "t2.base.ram"), true
	p2, err := Prepare(t.Context(), mon, req2)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Cleanup(t.Context(), mon)
	if p2.Mode != Diff {
		t.Fatalf("plan with %d of %d pages private: mode %v, want diff", helperPages/maxDeltaShare+1, helperPages, p2.Mode)
	}
	for _, f := range []string{req2.Base, req2.Temp + "-delta"} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s left by a plan that chose a copy (%v)", f, err)
		}
	}
}

// TestPlanDeltaPauseBound: private pages over what a pause may write make
// a delta when the source's writes can be tracked (the pages copied before
// the pause, none in it), and a full copy when they cannot.
func TestPlanDeltaPauseBound(t *testing.T) {
	rootOnly(t)
	defer func(n int64) { maxDeltaBytes = n }(maxDeltaBytes)
	maxDeltaBytes = 2 * pageSize
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
	plan := func(n string, track string) *Plan {
		t.Helper()
		r := req
		r.Template, r.Temp = filepath.Join(dir, n+".ram"), filepath.Join(dir, "."+n+".ram.tmp")
		r.Delta, r.Base, r.Track = filepath.Join(dir, n+".delta"), filepath.Join(dir, n+".base.ram"), track
		p, err := Prepare(t.Context(), &fakeMonitor{}, r)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Untracked: the pause would write 5 pages, over the bound of 2.
	p2 := plan("t2", "")
	if p2.Mode != Diff {
		t.Errorf("untracked, 5 private pages over a pause bound of 2: mode %v, want diff", p2.Mode)
	}
	p2.Cleanup(t.Context(), mon)
	p3 := plan("t3", filepath.Join(dir, "track.json"))
	defer p3.Cleanup(t.Context(), mon)
	if p3.Mode != Delta || !p3.tracked || p3.Precopied != 5*pageSize {
		t.Fatalf("tracked, 5 private pages over a pause bound of 2: mode %v, tracked %v, %d bytes before the pause; want delta, tracked, 5 pages (%v)", p3.Mode, p3.tracked, p3.Precopied, p3.TrackErr)
	}
	if n, err := p3.InPause(t.Context(), &PauseWindow{}); err != nil || n != 0 {
		t.Errorf("InPause = %d, %v; want nothing written in the pause", n, err)
	}
}

// TestPlanDeltaTracked: with the source's writes tracked (track.go), a
// delta is brought up to date before the pause: from the last delta (copied)
// and the pages written since its instant, or, without a last delta (the
// first one, or the last one gone), from all the private pages; the pause
// writes only what was written after that. Every delta holds exactly the instant's
// private pages.
func TestPlanDeltaTracked(t *testing.T) {
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
	fork := func(k int, between func()) (*Plan, int64, string) {
		t.Helper()
		r := req
		n := "t" + strconv.Itoa(k)
		r.Template, r.Temp = filepath.Join(dir, n+".ram"), filepath.Join(dir, "."+n+".ram.tmp")
		r.Delta, r.Base, r.Track = filepath.Join(dir, n+".delta"), filepath.Join(dir, n+".base.ram"), track
		p, err := Prepare(t.Context(), &fakeMonitor{}, r)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Cleanup(t.Context(), mon)
		if p.Mode != Delta {
			t.Fatalf("fork %d: mode %v, want delta", k, p.Mode)
		}
		if between != nil {
			between() // the source writes after Prepare, before the pause
		}
		copied, err := p.InPause(t.Context(), &PauseWindow{})
		if err != nil {
			t.Fatal(err)
		}
		if p.TrackErr != nil {
			t.Errorf("fork %d: write tracking: %v", k, p.TrackErr)
		}
		return p, copied, r.Delta
	}
	holds := func(delta string, want map[int]byte) {
		t.Helper()
		data, err := os.ReadFile(delta)
		if err != nil {
			t.Fatal(err)
		}
		for pg, b := range want {
			if data[pg*pageSize] != b {
				t.Errorf("%s page %d = %d, want %d", filepath.Base(delta), pg, data[pg*pageSize], b)
			}
		}
		var st syscall.Stat_t
		syscall.Stat(delta, &st)
		if st.Blocks*512 != int64(len(want))*pageSize {
			t.Errorf("%s holds %d bytes, want its %d private pages", filepath.Base(delta), st.Blocks*512, len(want))
		}
	}
	h.ask("set 2 21")
	h.ask("set 9 22")
	// After the copy before the pause: a private page written again, and
	// a page of the base written for the first time.
	p2, n2, d2 := fork(2, func() { h.ask("set 9 23"); h.ask("set 4 24") })
	if !p2.tracked || p2.Precopied != 2*pageSize || n2 != 2*pageSize {
		t.Errorf("fork 2 (nothing tracked yet): tracked %v, %d bytes before the pause, %d in it; want tracked, the 2 private pages before, the 2 written since in", p2.tracked, p2.Precopied, n2)
	}
	holds(d2, map[int]byte{2: 21, 4: 24, 9: 23})
	h.ask("set 2 31")
	h.ask("set 3 32")
	h.ask("get 9") // a read is no write
	// Before the pause: the last delta's 3 pages, then the 2 written since
	// its instant (2 and 3); in the pause, the one written after that.
	p3, n3, d3 := fork(3, func() { h.ask("set 3 33") })
	if !p3.tracked || n3 != pageSize || p3.Precopied != 5*pageSize {
		t.Errorf("fork 3: tracked %v, %d bytes in the pause, %d before; want tracked, 1 page (3 again) in, the last delta's 3 and the 2 written since before", p3.tracked, n3, p3.Precopied)
	}
	holds(d3, map[int]byte{2: 31, 3: 33, 4: 24, 9: 23})
	_, n4, d4 := fork(4, nil)
	if n4 != 0 {
		t.Errorf("fork 4 with nothing written: %d bytes in the pause", n4)
	}
	holds(d4, map[int]byte{2: 31, 3: 33, 4: 24, 9: 23})
	os.Remove(d4) // the last delta gone: no delta to start from
	h.ask("set 5 35")
	p5, n5, d5 := fork(5, nil)
	if !p5.tracked || p5.Precopied != 5*pageSize || n5 != 0 {
		t.Errorf("fork 5 without the last delta: tracked %v, %d bytes before the pause, %d in it; want tracked, all 5 private pages before, none in", p5.tracked, p5.Precopied, n5)
	}
	holds(d5, map[int]byte{2: 31, 3: 33, 4: 24, 5: 35, 9: 23})
	_, n6, d6 := fork(6, func() { h.ask("set 5 45") })
	if n6 != pageSize {
		t.Errorf("fork 6: %d bytes in the pause, want the 1 page written after the copy", n6)
	}
	holds(d6, map[int]byte{2: 31, 3: 33, 4: 24, 5: 45, 9: 23})
}
