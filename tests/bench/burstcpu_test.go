package bench

import (
	"bytes"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestHostTicks(t *testing.T) {
	busy, total, err := hostTicks([]byte("cpu  100 5 50 800 40 3 2 7 30 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"))
	if err != nil {
		t.Fatal(err)
	}
	// user nice system irq softirq steal; guest (30) is inside user already.
	if busy != 100+5+50+3+2+7 || total != 100+5+50+800+40+3+2+7 {
		t.Errorf("busy %d, total %d", busy, total)
	}
	if _, _, err := hostTicks([]byte("intr 1 2 3\n")); err == nil {
		t.Error("a /proc/stat without a cpu line was read")
	}
}

func TestProcTicks(t *testing.T) {
	// comm with a space and a parenthesis: fields count from the last ')'.
	stat := "4242 (qemu (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 5 0 99 0 0"
	if got, ok := procTicks([]byte(stat)); !ok || got != 1234+567 {
		t.Errorf("procTicks = %d %v, want 1801", got, ok)
	}
	if _, ok := procTicks([]byte("4242 (short) S 1")); ok {
		t.Error("a truncated stat was read")
	}
}

func TestGuestName(t *testing.T) {
	cmd := []byte("qemu-system-x86_64\x00-name\x00guest=burst-7,debug-threads=on\x00-qmp\x00unix:/var/tmp/vmfork-bench-1/m/burst-7/qmp.sock\x00")
	if n, ok := guestName(cmd, "/var/tmp/vmfork-bench-1"); !ok || n != "burst-7" {
		t.Errorf("guestName = %q %v", n, ok)
	}
	if _, ok := guestName(cmd, "/var/tmp/vmfork-bench-2"); ok {
		t.Error("a QEMU of another state dir was counted")
	}
	if _, ok := guestName([]byte("qemu-system-x86_64\x00/var/tmp/vmfork-bench-1\x00-name\x00"), "/var/tmp/vmfork-bench-1"); ok {
		t.Error("a -name without a value was read")
	}
}

// TestCPUSplit: each QEMU's ticks go to its child's state at the start of
// the interval; the rest of the host's busy time is someone else's.
func TestCPUSplit(t *testing.T) {
	t0 := time.Now()
	ev := &forkEvents{}
	ev.reset(nil)
	ev.started["ready"], ev.readyAt["ready"] = t0, t0.Add(time.Second)
	ev.started["late"], ev.readyAt["late"] = t0, t0.Add(2500*time.Millisecond) // READY inside the interval
	ev.started["new"] = t0.Add(2200 * time.Millisecond)                        // its QEMU new in the interval
	c := &cpuSampler{source: "src", cpus: 2, events: ev, t0: t0}
	a := cpuSnap{at: t0.Add(2 * time.Second), busy: 1000, total: 5000, self: 50, procs: map[int]qemuTicks{
		10: {"src", 300}, 11: {"ready", 80}, 12: {"late", 90}, 99: {"gone", 5},
	}}
	// 1 s later: 200 ticks of 2 CPUs.
	b := cpuSnap{at: t0.Add(3 * time.Second), busy: 1150, total: 5200, self: 60, procs: map[int]qemuTicks{
		10: {"src", 302}, 11: {"ready", 83}, 12: {"late", 150}, 13: {"new", 40},
	}}
	s, ok := c.split(a, b)
	if !ok {
		t.Fatal("no sample")
	}
	near := func(name string, got, want float64) {
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("source", s.Source, 0.02)
	near("idle children", s.IdleChildren, 0.03)
	near("children starting", s.ChainChildren, 0.60+0.40)
	near("vmfork", s.Vmfork, 0.10)
	near("other", s.Other, (150-2-3-60-40-10)/100.0)
	near("host idle", s.HostIdle, 0.50)
	if s.Ready != 1 || s.InChain != 1 {
		t.Errorf("ready %d, in chain %d; want 1, 1 (new had not started at the interval's start)", s.Ready, s.InChain)
	}
	if _, ok := c.split(b, b); ok {
		t.Error("an interval without time gave a sample")
	}
}

func TestBurstCSV(t *testing.T) {
	r := sampleBurst()
	var b bytes.Buffer
	if err := r.WriteChildrenCSV(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 5 || lines[0] != "name,started_ms,running_ms,ready_ms,failed_ms,chain_cpu_s" || lines[1] != "c1,5.0,95.0,300.0,,0.41" {
		t.Errorf("children CSV:\n%s", b.String())
	}
	b.Reset()
	if err := r.WriteCPUCSV(&b); err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[2], "900,2,2,0.050,1.300,") {
		t.Errorf("cpu CSV:\n%s", b.String())
	}
}

func TestTimeline(t *testing.T) {
	t0 := time.Now()
	ev := &forkEvents{}
	ev.reset(nil)
	ev.started["b"], ev.started["a"] = t0.Add(20*time.Millisecond), t0.Add(10*time.Millisecond)
	ev.running["a"] = runningAt{t0.Add(100 * time.Millisecond), 7}
	ev.readyAt["a"] = t0.Add(300 * time.Millisecond)
	ev.failed["b"] = t0.Add(400 * time.Millisecond)
	got := ev.timeline(t0)
	if len(got) != 2 || got[0].Name != "a" || got[0].RunningMS != 100 || got[0].ReadyMS != 300 ||
		got[1].Name != "b" || got[1].RunningMS != 0 || got[1].FailedMS != 400 {
		t.Errorf("timeline = %+v", got)
	}
	if ev.state("a", t0.Add(200*time.Millisecond)) != stateChain || ev.state("a", t0.Add(300*time.Millisecond)) != stateReady ||
		ev.state("b", t0) != stateNone || ev.state("b", t0.Add(time.Second)) != stateFailed {
		t.Error("states wrong")
	}
}

// TestBurstRunRoundTrip: the CSV files a run writes read back into the
// same timeline and CPU split.
func TestBurstRunRoundTrip(t *testing.T) {
	r := sampleBurst()
	dir := t.TempDir()
	for name, write := range map[string]func(io.Writer) error{"r-children.csv": r.WriteChildrenCSV, "r-cpu.csv": r.WriteCPUCSV} {
		var b bytes.Buffer
		if err := write(&b); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ReadBurstRun("r", filepath.Join(dir, "r-children.csv"), filepath.Join(dir, "r-cpu.csv"), 2)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Children, r.Children) {
		t.Errorf("children = %+v, want %+v", got.Children, r.Children)
	}
	// 0.45 s of the first sample, 0.45 s of the second.
	if cs := got.CPU.CoreSeconds; math.Abs(cs.ChainChildren-(1.4+1.3)*0.45) > 1e-9 || math.Abs(cs.IdleChildren-0.05*0.45) > 1e-9 {
		t.Errorf("core seconds = %+v", cs)
	}
	f := BurstRunsFigure("t", nil, []BurstRun{got, got}, Series{Name: "ref", Points: []Point{{0, 0}, {1, 2}}})
	var b bytes.Buffer
	if err := f.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, b.Bytes())
	if _, err := ReadBurstRun("r", filepath.Join(dir, "r-cpu.csv"), filepath.Join(dir, "r-cpu.csv"), 2); err == nil {
		t.Error("a CPU file read as a children file")
	}
}
