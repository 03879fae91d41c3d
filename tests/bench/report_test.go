package bench

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

var sampleHost = Host{CPUs: 2, CPUModel: "AMD EPYC", MemTotalBytes: 24 << 30, Kernel: "6.1.0", QEMU: "QEMU 7.2.22",
	Libvirt: "libvirt 9.0.0", Accel: "tcg", LoadAverage: "0.50 0.40 0.30", Started: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)}

func samplePeers() *PeersResult {
	methods := allMethods
	samples := []Sample{
		{Method: MethodVmfork, Round: 1, RunningMS: 93, AgentMS: 200, ReadyMS: 812, PSSBytes: 70 << 20, PauseMS: 68, WallMS: 900,
			Memory: Memory{GuestRAMBytes: 30 << 20, TCGBytes: 20 << 20, AnonBytes: 15 << 20, FileBytes: 5 << 20},
			Phases: Phases{QEMUStartMS: 60, LoadMS: 20, ContMS: 13, AgentMS: 107, IdentityMS: 612},
			Steps:  []Step{{Name: "vmfork.agent", Status: "ok", DurationMS: 107}, {Name: "vmfork.clock", Status: "ok", DurationMS: 112}, {Name: "vmfork.network", Status: "ok", DurationMS: 500}}},
		{Method: MethodFloor, Round: 1, RunningMS: 80, AgentMS: 180, ReadyMS: 180, PSSBytes: 60 << 20,
			Phases: Phases{QEMUStartMS: 50, LoadMS: 20, ContMS: 10, AgentMS: 100}},
		{Method: MethodKept, Round: 1, RunningMS: 12, AgentMS: 112, ReadyMS: 112, PSSBytes: 60 << 20, PoolIdlePSSBytes: 25 << 20, Phases: Phases{LoadMS: 10, ContMS: 2, AgentMS: 100}},
		{Method: MethodRestore, Round: 1, RunningMS: 2100, AgentMS: 2200, ReadyMS: 2200, PSSBytes: 700 << 20, PauseMS: 4000, WallMS: 4200,
			Phases: Phases{SaveMS: 1900, CopyMS: 100, RestoreMS: 2100, AgentMS: 100}},
		{Method: MethodCold, Round: 1, AgentMS: 6000, ReadyMS: 6000, PSSBytes: 400 << 20},
		{Method: MethodLibvirtDriver, Round: 1, RunningMS: 450, AgentMS: 600, ReadyMS: 1250, PSSBytes: 85 << 20, PauseMS: 1100, WallMS: 2500,
			TemplateRAMBytes: 1600 << 20, Phases: Phases{AgentMS: 150, IdentityMS: 650}},
		{Method: MethodLibvirtCreate, Round: 1, RunningMS: 420},
	}
	samples[0].TemplateRAMBytes = 1580 << 20
	samples[3].SaveFileBytes = 1620 << 20
	ss := summarize(samples, methods)
	return &PeersResult{Host: sampleHost, Rounds: 1, SettleMS: 2000, Sizes: []PeersSize{{
		MemoryMiB: 2048, SourceBootMS: 6000, LibvirtBootMS: 7000, LibvirtDriverBootMS: 7500, SourceRSSBytes: 300 << 20,
		GuestUseMiB: 1536, Fills: []Fill{{Source: "vmfork", Guest: "src2048", RequestedMiB: 1536, WrittenBytes: 1536 << 20, DurationMS: 9000,
			Before: Meminfo{TotalBytes: 1990 << 20, FreeBytes: 1800 << 20, AvailableBytes: 1850 << 20},
			After:  Meminfo{TotalBytes: 1990 << 20, FreeBytes: 260 << 20, AvailableBytes: 300 << 20, ShmemBytes: 1536 << 20}}},
		Summary: ss, Ratios: peerRatios(ss), Samples: samples,
	}}, GuestUse: GuestUse{Percent: 75}, Methods: methods}
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
	r.Children = []BurstChild{
		{Name: "c1", StartedMS: 5, RunningMS: 95, ReadyMS: 300, ChainCPUS: 0.41},
		{Name: "c2", StartedMS: 6, RunningMS: 100, ReadyMS: 320, ChainCPUS: 0.43},
		{Name: "c3", StartedMS: 301, RunningMS: 400, ReadyMS: 700, ChainCPUS: 0.52},
		{Name: "c4", StartedMS: 321, RunningMS: 420, ReadyMS: 890, ChainCPUS: 0.60},
	}
	r.CPU = &BurstCPU{CPUs: 2, ChainCPUSeconds: Spread{0.47, 0.6, 0.6}, IdleChildCores: 0.031,
		CoreSeconds: CPUSplit{IdleChildren: 0.02, ChainChildren: 1.2, Source: 0.05, Vmfork: 0.2, Other: 0.1, HostIdle: 0.23},
		Samples: []CPUSample{
			{AtMS: 450, InChain: 2, CPUSplit: CPUSplit{ChainChildren: 1.4, Source: 0.05, Vmfork: 0.3, Other: 0.1, HostIdle: 0.15}, CPUPressure: 40},
			{AtMS: 900, Ready: 2, InChain: 2, CPUSplit: CPUSplit{IdleChildren: 0.05, ChainChildren: 1.3, Source: 0.05, Vmfork: 0.2, Other: 0.1, HostIdle: 0.3}, CPUPressure: 55},
		}}
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

// TestLibvirtDriverRatios checks the rows that compare vmfork's libvirt
// driver with libvirt's own ways, and that they are left out when the
// driver was not measured.
func TestLibvirtDriverRatios(t *testing.T) {
	ss := []Summary{
		{Method: MethodVmfork, RunningMS: 60, AgentMS: 180, ReadyMS: 700, PSSBytes: 90 << 20},
		{Method: MethodRestore, RunningMS: 2000, AgentMS: 2100, ReadyMS: 2100, PSSBytes: 1700 << 20, PauseMS: 9000},
		{Method: MethodLibvirtDriver, RunningMS: 560, AgentMS: 700, ReadyMS: 1500, PSSBytes: 100 << 20, PauseMS: 900},
		{Method: MethodLibvirtCreate, RunningMS: 420},
	}
	byName := map[string]Ratio{}
	for _, r := range peerRatios(ss) {
		byName[r.Name] = r
	}
	check := func(name string, value float64, met *bool, by float64) {
		t.Helper()
		r, ok := byName[name]
		switch {
		case !ok:
			t.Errorf("no row %q", name)
		case r.Value < value-0.01 || r.Value > value+0.01:
			t.Errorf("%s = %v, want %v", name, r.Value, value)
		case (met == nil) != (r.Met == nil) || (met != nil && *met != *r.Met):
			t.Errorf("%s: met %v, want %v", name, r.Met, met)
		case r.By < by-0.01 || r.By > by+0.01:
			t.Errorf("%s: missed by %v, want %v", name, r.By, by)
		}
	}
	yes, no := true, false
	check("child PSS: libvirt restore / libvirt driver", 17, &yes, 0)
	check("child ready: libvirt restore / libvirt driver", 1.4, &no, 10/1.4)
	check("agent answers: libvirt restore / libvirt driver", 3, &no, 10.0/3)
	check("child running: libvirt driver - virsh create --paused", 140, &no, 40)
	check("child running: libvirt driver / virsh create --paused", 560.0/420, nil, 0)
	check("source pause: libvirt save+restore / libvirt driver", 10, nil, 0)
	if r := byName["child running: libvirt driver - virsh create --paused"]; r.Unit != "ms" || r.Target != "<= +100 ms" || fmtRatio(r) != "+140 ms" {
		t.Errorf("difference row: unit %q, target %q, printed %q", r.Unit, r.Target, fmtRatio(r))
	}
	for _, r := range peerRatios(ss[:2]) {
		if strings.Contains(r.Name, "libvirt driver") {
			t.Errorf("row %q without the libvirt driver measured", r.Name)
		}
	}
}
