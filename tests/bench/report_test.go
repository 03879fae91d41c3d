package bench

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

var sampleHost = Host{CPUs: 2, CPUModel: "AMD EPYC", MemTotalBytes: 24 << 30, Kernel: "6.1.0", QEMU: "QEMU 7.2.22",
	Libvirt: "libvirt 9.0.0", Accel: "tcg", LoadAverage: "0.50 0.40 0.30", Started: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)}

func samplePeers() *PeersResult {
	methods := []Method{MethodVmfork, MethodFloor, MethodWarm, MethodRestore, MethodCold}
	samples := []Sample{
		{Method: MethodVmfork, Round: 1, RunningMS: 93, AgentMS: 200, ReadyMS: 812, PSSBytes: 70 << 20, PauseMS: 68, WallMS: 900,
			Memory: Memory{GuestRAMBytes: 30 << 20, TCGBytes: 20 << 20, AnonBytes: 15 << 20, FileBytes: 5 << 20},
			Phases: Phases{QEMUStartMS: 60, LoadMS: 20, ContMS: 13, AgentMS: 107, IdentityMS: 612},
			Steps:  []Step{{Name: "vmfork.agent", Status: "ok", DurationMS: 107}, {Name: "vmfork.clock", Status: "ok", DurationMS: 112}, {Name: "vmfork.network", Status: "ok", DurationMS: 500}}},
		{Method: MethodFloor, Round: 1, RunningMS: 80, AgentMS: 180, ReadyMS: 180, PSSBytes: 60 << 20,
			Phases: Phases{QEMUStartMS: 50, LoadMS: 20, ContMS: 10, AgentMS: 100}},
		{Method: MethodWarm, Round: 1, RunningMS: 12, AgentMS: 112, ReadyMS: 112, PSSBytes: 60 << 20, PoolIdlePSSBytes: 25 << 20, Phases: Phases{LoadMS: 10, ContMS: 2, AgentMS: 100}},
		{Method: MethodRestore, Round: 1, RunningMS: 2100, AgentMS: 2200, ReadyMS: 2200, PSSBytes: 700 << 20, PauseMS: 4000, WallMS: 4200,
			Phases: Phases{SaveMS: 1900, CopyMS: 100, RestoreMS: 2100, AgentMS: 100}},
		{Method: MethodCold, Round: 1, AgentMS: 6000, ReadyMS: 6000, PSSBytes: 400 << 20},
	}
	ss := summarize(samples, methods)
	return &PeersResult{Host: sampleHost, Rounds: 1, SettleMS: 2000, Sizes: []PeersSize{{
		MemoryMiB: 2048, SourceBootMS: 6000, LibvirtBootMS: 7000, SourceRSSBytes: 300 << 20,
		Summary: ss, Ratios: peerRatios(ss), Samples: samples,
	}}}
}

func sampleBurst() *BurstResult {
	r := &BurstResult{Host: sampleHost, MemoryMiB: 256, Count: 4, Parallel: 2, SettleMS: 2000, PauseMS: 70, WallMS: 900,
		ChildrenPerSecond: 4.44, Ready: 4, Answered: 4, ReadyAtMS: []float64{300, 320, 700, 890},
		RunningMS: Spread{90, 100, 110}, AgentMS: Spread{190, 200, 210}, ReadyMS: Spread{800, 820, 830},
		TotalPSSBytes: 200 << 20, ChildPSSBytes: Spread{50 << 20, 55 << 20, 60 << 20}, SourcePSSBytes: 250 << 20,
		TemplateRAMBytes: 130 << 20, GuestRAMBytes: 4 * 256 << 20, MemAvailBefore: 20 << 30, MemAvailAfter: 19 << 30}
	r.PSSShare = float64(r.TotalPSSBytes) / float64(r.GuestRAMBytes)
	all := true
	r.Ratios = []Ratio{{Name: "children answering their agent", Value: 4, Target: "= 4", Met: &all}, atMost("total PSS / (N x guest RAM)", r.PSSShare, 0.25)}
	return r
}

func sampleScale() *ScaleResult {
	r := &ScaleResult{Host: sampleHost, Rounds: 1, Parallel: 4, ChildMemoryMiB: 256,
		ByMemory: []ScalePoint{
			{MemoryMiB: 256, Children: 1, PauseMS: 70, RunningMS: 90, ReadyMS: 200, WallMS: 280, TemplateRAMBytes: 130 << 20, SourceBootMS: 5000},
			{MemoryMiB: 4096, Children: 1, PauseMS: 280, RunningMS: 100, ReadyMS: 220, WallMS: 510, TemplateRAMBytes: 200 << 20, SourceBootMS: 7000},
		},
		ByChildren: []ScalePoint{
			{MemoryMiB: 256, Children: 1, PauseMS: 70, RunningMS: 90, ReadyMS: 200, LastMS: 200, WallMS: 280},
			{MemoryMiB: 256, Children: 32, PauseMS: 75, RunningMS: 150, ReadyMS: 400, LastMS: 600, WallMS: 4000},
		}}
	r.Growth = growth(r)
	return r
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./tests/bench -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (go test ./tests/bench -update rewrites it)\ngot:\n%s\nwant:\n%s", name, got, want)
	}
}

func TestTables(t *testing.T) {
	var b bytes.Buffer
	if err := samplePeers().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	golden(t, "peers.txt", b.Bytes())
	b.Reset()
	if err := sampleBurst().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	golden(t, "burst.txt", b.Bytes())
	b.Reset()
	if err := sampleScale().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	golden(t, "scale.txt", b.Bytes())
}

func TestReadyQuantiles(t *testing.T) {
	if got, want := readyQuantiles([]float64{100, 200, 300, 400}, 4), "10% at 100 ms, 50% at 200 ms, 90% at 400 ms, 100% at 400 ms"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// Children that never came up are not hidden.
	if got, want := readyQuantiles([]float64{100}, 4), "10% at 100 ms, 50%: never, 90%: never, 100%: never"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
