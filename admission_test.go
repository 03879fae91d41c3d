package vmfork

import (
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
)

// fakeHost is a HostProbe of a given size: no guest, no /proc.
type fakeHost struct {
	mu           sync.Mutex
	total, avail int64
	space        map[string]DirSpace // by directory; others: 100 GiB free
	private      map[string]int64    // by machine name
	cpu          float64
	cpuOK        bool
	ticks        int64
	stuck        bool // its QEMUs get no CPU
}

const gib = int64(1) << 30

// hostOf returns a fake host with total and avail bytes of memory, plenty of
// disk and a tmpfs mem dir as big as its memory.
func hostOf(s *Store, total, avail int64) *fakeHost {
	return &fakeHost{total: total, avail: avail, private: map[string]int64{}, space: map[string]DirSpace{
		s.MemDir: {Free: total, Size: total, Tmpfs: true},
	}}
}

func (h *fakeHost) Memory() (int64, int64, error) { return h.total, h.avail, nil }
func (h *fakeHost) Space(dir string) (DirSpace, error) {
	if s, ok := h.space[dir]; ok {
		return s, nil
	}
	return DirSpace{Free: 100 * gib, Size: 200 * gib}, nil
}
func (h *fakeHost) PrivateRAM(m *Machine) (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, ok := h.private[m.Name]
	return n, ok
}
func (h *fakeHost) CPUPressure() (float64, bool) { return h.cpu, h.cpuOK }
func (h *fakeHost) CPUTicks(pid int) (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.stuck {
		h.ticks += 10 // a guest that runs
	}
	return h.ticks, pid != 0
}

// thisHost is the host of issue 29: 24 GiB, 21.5 GiB of it available.
func thisHost(s *Store) *fakeHost { return hostOf(s, 24*gib, 43*gib/2) }

// TestAdmissionBursts: the default policy lets 100 children of a 256 MiB
// guest through on a 24 GiB host when none was measured yet, and refuses
// 100 children of a source whose children each made 512 MiB private, before
// anything is paused or made; what a child made outlives it.
func TestAdmissionBursts(t *testing.T) {
	mg, d := newTestManager(t)
	h := thisHost(mg.Store)
	mg.Host = h
	bootFake(t, mg, "web")
	ctx := t.Context()
	p, err := mg.PlanFork(ctx, ForkRequest{Source: "web", Count: 100})
	if err != nil {
		t.Fatalf("100 x 256 MiB, nothing measured: %v; want admitted", err)
	}
	if a := p.Admission; a == nil || a.RAMBasis != basisGuest || a.RAMBytes != 100*256<<20 || !a.Checked {
		t.Fatalf("admission %+v: want 25 GiB of guest RAM, checked", a)
	}
	if _, err := mg.Fork(ctx, ForkRequest{Source: "web", Count: 1, Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	h.private["web-1"] = 512 << 20
	before := stateTree(t, mg.Store)
	freezes := d.freezeSeen
	_, perr := mg.PlanFork(ctx, ForkRequest{Source: "web", Count: 100})
	_, err = mg.Fork(ctx, ForkRequest{Source: "web", Count: 100, Identity: quietChain})
	if !errors.Is(err, ErrNoRoom) || perr == nil || perr.Error() != err.Error() {
		t.Fatalf("100 children of 512 MiB each: dry run %v, real run %v; want the same ErrNoRoom", perr, err)
	}
	for _, want := range []string{`fork "web": not enough room: memory: 100 children need about 50.0 GiB (512 MiB each: the most any of 1 earlier child of "web" made private)`, "short", "--overcommit"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
	if got := withoutLocks(stateTree(t, mg.Store)); got != withoutLocks(before) || d.freezeSeen != freezes || d.paused["web"] {
		t.Errorf("the refused fork changed something: froze %d times, paused %v\n%s\nwant\n%s", d.freezeSeen-freezes, d.paused["web"], got, before)
	}
	// Gone, the child is still counted: rm keeps what it made.
	if err := mg.Remove(ctx, "web-1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.PlanFork(ctx, ForkRequest{Source: "web", Count: 100}); !errors.Is(err, ErrNoRoom) {
		t.Errorf("after rm of the measured child: %v, want ErrNoRoom", err)
	}
	// A smaller fork fits; the estimate says where it comes from.
	p, err = mg.PlanFork(ctx, ForkRequest{Source: "web", Count: 10})
	if err != nil || p.Admission.RAMBasis != basisMeasured || p.Admission.RAMEachBytes != 512<<20 {
		t.Fatalf("10 children: %v, %+v; want admitted on the measured 512 MiB", err, p)
	}
	if a := strings.Join(p.Actions, "\n"); !strings.Contains(a, "take about 5.0 GiB of RAM for 10 new QEMU processes (512 MiB each, measured on 1 earlier child)") {
		t.Errorf("plan says %q", a)
	}
	// The policy decides: off lets anything through, with the estimate.
	mg.Admission = AdmissionPolicy{Off: true}
	if p, err := mg.PlanFork(ctx, ForkRequest{Source: "web", Count: 100}); err != nil || p.Admission.Checked {
		t.Errorf("--overcommit off: %v, %+v; want admitted, unchecked", err, p)
	}
}

// TestAdmissionOvercommit: the ratio scales what the host can give.
func TestAdmissionOvercommit(t *testing.T) {
	mg, _ := newTestManager(t)
	mg.Host = thisHost(mg.Store)
	bootFake(t, mg, "web")
	for _, c := range []struct {
		ratio float64
		count int
		ok    bool
	}{
		{0, 100, true},    // default 2: 25 GiB of (21.5-1.2)*2
		{1, 100, false},   // 25 GiB > 20.3 GiB
		{1, 80, true},     // 20 GiB
		{0.5, 40, true},   // 10 GiB
		{0.5, 41, false},  // 10.25 GiB > 10.15 GiB
		{100, 128, true},  //
		{0.01, 1, false},  // 256 MiB > 208 MiB
		{0.02, 1, true},   // 416 MiB
		{1.5, 100, true},  // 30.4 GiB
		{1.2, 100, false}, // 24.4 GiB
	} {
		mg.Admission = AdmissionPolicy{Overcommit: c.ratio}
		_, err := mg.PlanFork(t.Context(), ForkRequest{Source: "web", Count: c.count})
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrNoRoom)) {
			t.Errorf("overcommit %g, %d children: %v; want admitted %v", c.ratio, c.count, err, c.ok)
		}
	}
}

// TestAdmissionSpace: the mem dir and the state dir are checked too, each
// named with what it lacks.
func TestAdmissionSpace(t *testing.T) {
	mg, _ := newTestManager(t)
	h := thisHost(mg.Store)
	mg.Host = h
	bootFake(t, mg, "db")
	if _, err := mg.Stop(t.Context(), "db", true); err != nil {
		t.Fatal(err)
	}
	// A stopped source's children boot: their RAM files go to the mem dir.
	h.space[mg.Store.MemDir] = DirSpace{Free: 1 * gib, Size: 2 * gib, Tmpfs: true}
	_, err := mg.PlanFork(t.Context(), ForkRequest{Source: "db", Count: 8})
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "mem dir "+mg.Store.MemDir+" is full for this: it needs 2.0 GiB, has 922 MiB free above a 103 MiB reserve: 1.1 GiB short") {
		t.Errorf("8 booting children, 1 GiB of mem dir: %v", err)
	}
	h.space[mg.Store.StateDir] = DirSpace{Free: 20 << 20, Size: 1 * gib}
	_, err = mg.PlanFork(t.Context(), ForkRequest{Source: "db", Count: 2})
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "state dir "+mg.Store.StateDir+" is full for this: it needs 2 MiB, has 0 MiB free above a 52 MiB reserve") {
		t.Errorf("20 MiB of state dir: %v", err)
	}
	// The policy's ratio is for RAM only: space is never overcommitted.
	mg.Admission = AdmissionPolicy{Overcommit: 100}
	if _, err := mg.PlanFork(t.Context(), ForkRequest{Source: "db", Count: 2}); !errors.Is(err, ErrNoRoom) {
		t.Errorf("overcommit 100, no disk: %v, want ErrNoRoom", err)
	}
}

// TestAdmissionPool: a bigger warm pool is admitted as its members would
// be forked.
func TestAdmissionPool(t *testing.T) {
	mg, _ := newPoolManager(t)
	bootFake(t, mg, "web")
	if _, err := mg.Keep(t.Context(), KeepRequest{Source: "web", Name: "golden"}); err != nil {
		t.Fatal(err)
	}
	mg.Host = hostOf(mg.Store, 8*gib, 2*gib)
	_, err := mg.PlanPool(t.Context(), "golden", 20)
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), `template pool "golden": not enough room: memory: 20 pool members need about 5.0 GiB`) {
		t.Errorf("pool of 20 on 2 GiB available: %v", err)
	}
	if _, err := mg.SetPool(t.Context(), "golden", 2); err != nil {
		t.Errorf("pool of 2: %v", err)
	}
	_, err = mg.Keep(t.Context(), KeepRequest{Source: "web", Name: "t2", Pool: 20})
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), `keep "web": not enough room`) {
		t.Errorf("template save with a pool of 20: %v", err)
	}
}

func TestParseOvercommit(t *testing.T) {
	for in, want := range map[string]AdmissionPolicy{
		"": {}, "off": {Off: true}, "1": {Overcommit: 1}, "2.5": {Overcommit: 2.5}, "100": {Overcommit: 100}, "0.1": {Overcommit: 0.1},
	} {
		if got, err := ParseOvercommit(in); err != nil || got != want {
			t.Errorf("ParseOvercommit(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"0", "-1", "abc", "NaN", "101", "Inf", "1,5", "on"} {
		if _, err := ParseOvercommit(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseOvercommit(%q): %v, want ErrInvalid", in, err)
		}
	}
}

func TestHostParsers(t *testing.T) {
	total, avail, err := parseMeminfo([]byte("MemTotal:       24683584 kB\nMemFree:        23205444 kB\nMemAvailable:   24083068 kB\n"))
	if err != nil || total != 24683584<<10 || avail != 24083068<<10 {
		t.Errorf("parseMeminfo: %d %d %v", total, avail, err)
	}
	if _, _, err := parseMeminfo([]byte("MemTotal: 1 kB\n")); err == nil {
		t.Error("parseMeminfo without MemAvailable: no error")
	}
	if n, ok := parseStatTicks([]byte("1234 (qemu system) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 70 0 0 20 0 3 0 12 0 0")); !ok || n != 320 {
		t.Errorf("parseStatTicks: %d %v, want 320", n, ok)
	}
	pct, ok := parseCPUPressure([]byte("some avg10=63.20 avg60=40.01 avg300=12.00 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"))
	if !ok || pct != 63.2 {
		t.Errorf("parseCPUPressure: %v %v", pct, ok)
	}
	if _, ok := parseCPUPressure([]byte("")); ok {
		t.Error("parseCPUPressure of nothing: ok")
	}
}

// TestPacedParallel: CPU pressure slows a fork's start down, never below
// one child at a time.
func TestPacedParallel(t *testing.T) {
	for _, c := range []struct {
		parallel int
		pct      float64
		ok       bool
		want     int
	}{
		{4, 0, false, 4}, {4, 10, true, 4}, {4, 59.9, true, 4}, {4, 60, true, 2}, {4, 89, true, 2},
		{4, 90, true, 1}, {4, 100, true, 1}, {1, 70, true, 1}, {8, 70, true, 4},
	} {
		if got := pacedParallel(c.parallel, c.pct, c.ok); got != c.want {
			t.Errorf("pacedParallel(%d, %v, %v) = %d, want %d", c.parallel, c.pct, c.ok, got, c.want)
		}
	}
}

// TestSlowGuest: a guest is slow, not dead, while its QEMU runs on a host
// whose CPUs are contended; on an idle host, or gone, it is not.
func TestSlowGuest(t *testing.T) {
	mg, _ := newTestManager(t)
	h := thisHost(mg.Store)
	mg.Host = h
	slow := mg.slowGuest(&Machine{Name: "c", PID: 42})
	if slow() {
		t.Error("no pressure information: slow")
	}
	h.cpu, h.cpuOK = 90, true
	if !slow() {
		t.Error("busy host, guest runs: not slow")
	}
	h.cpu = 30
	if slow() {
		t.Error("idle host: slow")
	}
	h.cpu = 90
	if mg.slowGuest(&Machine{Name: "gone"})() {
		t.Error("no process: slow")
	}
}

// TestAdmissionStart: the hook for vmfork start counts the machine's whole
// RAM, in the mem dir.
func TestAdmissionStart(t *testing.T) {
	mg, _ := newTestManager(t)
	mg.Host = hostOf(mg.Store, 8*gib, 1*gib)
	m := &Machine{Name: "big", Spec: Spec{MemoryMiB: 4096}}
	_, err := mg.admit(mg.startDemand(m))
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), `start "big": not enough room: memory: 1 machine needs about 4.0 GiB`) {
		t.Errorf("start of a 4 GiB machine on 1 GiB available: %v", err)
	}
	m.Spec.MemoryMiB = 256
	if a, err := mg.admit(mg.startDemand(m)); err != nil || a.MemDirBytes != 256<<20 || a.RAMBytes != 256<<20 {
		t.Errorf("start of a 256 MiB machine: %+v, %v", a, err)
	}
}

// TestProcHost reads this host: what admission sees on a real one.
func TestProcHost(t *testing.T) {
	var h procHost
	total, avail, err := h.Memory()
	if err != nil || total <= 0 || avail <= 0 || avail > total {
		t.Errorf("Memory: %d %d %v", total, avail, err)
	}
	if s, err := h.Space(t.TempDir()); err != nil || s.Size <= 0 {
		t.Errorf("Space: %+v %v", s, err)
	}
	if n, ok := h.CPUTicks(os.Getpid()); !ok || n < 0 {
		t.Errorf("CPUTicks of this process: %d %v", n, ok)
	}
	if _, ok := h.PrivateRAM(&Machine{Name: "no-such-machine-here", PID: os.Getpid()}); ok {
		t.Error("PrivateRAM of a process that is not the machine's: ok")
	}
}

// TestAdmissionPending: running children that have not yet made private
// what their siblings did count for the difference: the host's available
// memory does not hold it yet.
func TestAdmissionPending(t *testing.T) {
	mg, _ := newTestManager(t)
	h := thisHost(mg.Store)
	mg.Host = h
	bootFake(t, mg, "web")
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "web", Count: 3, Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	h.private["web-1"], h.private["web-2"], h.private["web-3"] = 512<<20, 12<<20, 500<<20
	p, err := mg.PlanFork(t.Context(), ForkRequest{Source: "web", Count: 10})
	if err != nil {
		t.Fatal(err)
	}
	if a := p.Admission; a.PendingBytes != 512<<20 || a.RAMBytes != 10*512<<20+512<<20 || a.Measured != 3 {
		t.Errorf("admission %+v: want 512 MiB pending (500 + 12) on top of 10 x 512 MiB", a)
	}
	mg.Admission = AdmissionPolicy{Overcommit: 0.25}
	_, err = mg.PlanFork(t.Context(), ForkRequest{Source: "web", Count: 10})
	if err == nil || !strings.Contains(err.Error(), `10 children need about 5.5 GiB (512 MiB each: the most any of 3 earlier children of "web" made private; plus 512 MiB its 3 running children may still make private)`) {
		t.Errorf("at overcommit 0.25: %v", err)
	}
}

// TestFreezeMemDir: a machine's first freeze adds nothing to the mem dir;
// once its RAM file has a second name (a template's), the next one copies it.
func TestFreezeMemDir(t *testing.T) {
	dir := t.TempDir()
	own := dir + "/web.ram"
	if err := os.WriteFile(own, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	m := &Machine{Name: "web", Paths: Paths{RAM: own, RAMShared: true}}
	if n := freezeMemDir(m); n != 0 {
		t.Errorf("first freeze: %d bytes, want 0", n)
	}
	if err := os.Link(own, dir+"/tpl.ram"); err != nil {
		t.Fatal(err)
	}
	if n := freezeMemDir(m); n != 1<<20 {
		t.Errorf("second freeze: %d bytes, want the file's 1 MiB", n)
	}
	child := &Machine{Name: "web-1", Paths: Paths{RAM: dir + "/tpl.ram"}}
	if n := freezeMemDir(child); n != 1<<20 {
		t.Errorf("a child's freeze: %d bytes, want the template file's 1 MiB", n)
	}
}
