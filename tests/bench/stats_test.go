package bench

import (
	"math"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := append([]float64(nil), tc.in...)
		if got := Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
		for i := range in {
			if in[i] != tc.in[i] {
				t.Fatalf("Median reordered its input: got %v, want %v", tc.in, in)
			}
		}
	}
}

func TestPercentile(t *testing.T) {
	v := []float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}
	for p, want := range map[float64]float64{90: 90, 100: 100, 50: 50, 1: 10} {
		if got := Percentile(v, p); got != want {
			t.Errorf("Percentile(%v) = %v, want %v", p, got, want)
		}
	}
	if got := Percentile(nil, 90); got != 0 {
		t.Errorf("Percentile(nil) = %v, want 0", got)
	}
}

func TestFactor(t *testing.T) {
	if got := Factor(700, 200); got != 3.5 {
		t.Errorf("Factor(700, 200) = %v, want 3.5", got)
	}
	// Unmeasured (0) on either side gives no ratio rather than 0 or +Inf.
	if got := Factor(0, 200); got != 0 {
		t.Errorf("Factor(0, 200) = %v, want 0", got)
	}
	if got := Factor(700, 0); got != 0 {
		t.Errorf("Factor(700, 0) = %v, want 0", got)
	}
}

func TestGrowthExponent(t *testing.T) {
	for _, tc := range []struct {
		x1, y1, x2, y2, want float64
	}{
		{256, 100, 4096, 1600, 1},  // grows with RAM
		{256, 100, 4096, 100, 0},   // flat
		{256, 100, 4096, 400, 0.5}, // 16x RAM, 4x time
		{256, 0, 4096, 400, 0},     // unmeasured
	} {
		if got := GrowthExponent(tc.x1, tc.y1, tc.x2, tc.y2); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("GrowthExponent(%v, %v, %v, %v) = %v, want %v", tc.x1, tc.y1, tc.x2, tc.y2, got, tc.want)
		}
	}
}

func TestParseMeminfo(t *testing.T) {
	data := []byte("MemTotal:       24683768 kB\nMemFree:        23950000 kB\nMemAvailable:   24300012 kB\nHugePages_Total:       0\n")
	if got, want := parseMeminfo(data, "MemAvailable"), int64(24300012)<<10; got != want {
		t.Errorf("MemAvailable = %d, want %d", got, want)
	}
	if got := parseMeminfo(data, "HugePages_Total"); got != 0 {
		t.Errorf("HugePages_Total = %d, want 0", got)
	}
	if got := parseMeminfo(data, "Nope"); got != 0 {
		t.Errorf("missing field = %d, want 0", got)
	}
}

func TestPeerRatios(t *testing.T) {
	ss := summarize([]Sample{
		{Method: MethodVmfork, RunningMS: 90, AgentMS: 150, ReadyMS: 200, PSSBytes: 60 << 20, PauseMS: 70,
			Steps: []Step{{Name: "vmfork.agent", DurationMS: 60}, {Name: "vmfork.clock", DurationMS: 30}}},
		{Method: MethodVmfork, RunningMS: 110, AgentMS: 270, ReadyMS: 220, PSSBytes: 70 << 20, PauseMS: 90,
			Steps: []Step{{Name: "vmfork.agent", DurationMS: 100}, {Name: "vmfork.clock", DurationMS: 50}}},
		{Method: MethodFloor, RunningMS: 80, AgentMS: 180, ReadyMS: 180, PSSBytes: 50 << 20},
		{Method: MethodRestore, RunningMS: 2000, AgentMS: 2100, ReadyMS: 2100, PSSBytes: 650 << 20, PauseMS: 4000},
	}, []Method{MethodVmfork, MethodFloor, MethodKept, MethodRestore})
	if len(ss) != 3 {
		t.Fatalf("got %d summaries, want 3 (no kept-template samples)", len(ss))
	}
	if vf := ss[0]; vf.RunningMS != 100 || vf.ReadyMS != 210 || vf.PSSBytes != 65<<20 || vf.Samples != 2 {
		t.Errorf("vmfork summary = %+v, want medians 100/210 ms, 65 MiB of 2 samples", vf)
	}
	if st := ss[0].Steps; len(st) != 2 || st[0].Name != "vmfork.agent" || st[0].DurationMS != 80 || st[1].DurationMS != 40 {
		t.Errorf("vmfork steps = %+v, want agent 80 ms then clock 40 ms (medians, in chain order)", st)
	}
	got := map[string]Ratio{}
	for _, r := range peerRatios(ss) {
		got[r.Name] = r
	}
	ready := got["child ready: libvirt restore / vmfork"]
	if ready.Value != 10 || ready.Met == nil || !*ready.Met {
		t.Errorf("ready ratio = %+v, want 10, met", ready)
	}
	pss := got["child PSS: libvirt restore / vmfork"]
	if pss.Value != 10 || pss.Met == nil || !*pss.Met {
		t.Errorf("PSS ratio = %+v, want 10, met", pss)
	}
	floor := got["child running: vmfork / floor"]
	if floor.Value != 1.25 || floor.Met == nil || !*floor.Met {
		t.Errorf("floor ratio = %+v, want 1.25, met", floor)
	}
	if _, ok := got["child ready: libvirt restore / kept template"]; ok {
		t.Error("a ratio against the kept template, which was not measured")
	}
	miss := atLeast("x", 2.5, 10)
	if miss.Met == nil || *miss.Met || miss.By != 4 {
		t.Errorf("atLeast(2.5, 10) = %+v, want missed by 4", miss)
	}
}
