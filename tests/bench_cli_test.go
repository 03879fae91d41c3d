//go:build integration

package tests

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// benchBin is the CLI built with `vmfork bench` (make build: bin/vmfork-bench).
func benchBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("VMFORK_BENCH_BIN")
	if bin == "" {
		t.Fatal("VMFORK_BENCH_BIN is not set: run the integration tests with `make integration`")
	}
	return bin
}

// benchBases are the parents of one test's bench runs: its own, so that
// another bench on the host (or a parallel test) cannot look like a leak.
type benchBases struct{ tmp, shm string }

func newBenchBases(t *testing.T) benchBases {
	t.Helper()
	shm, err := os.MkdirTemp("/dev/shm", "vmfork-benchtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	return benchBases{tmp: t.TempDir(), shm: shm}
}

// command runs the bench CLI with its run dirs under b.
func (b benchBases) command(t *testing.T, args ...string) *exec.Cmd {
	cmd := exec.Command(benchBin(t), args...)
	cmd.Env = append(os.Environ(), "VMFORK_BENCH_TMP="+b.tmp, "VMFORK_BENCH_SHM="+b.shm)
	return cmd
}

// dirs lists the run directories the bench made under b, and the QEMU
// processes that use any.
func (b benchBases) dirs() []string {
	a, _ := filepath.Glob(filepath.Join(b.tmp, "vmfork-bench-*"))
	s, _ := filepath.Glob(filepath.Join(b.shm, "vmfork-bench-*"))
	for _, base := range []string{b.tmp, b.shm} {
		for _, pid := range qemuMentioning(base + "/vmfork-bench-") {
			a = append(a, "qemu pid "+strconv.Itoa(pid))
		}
	}
	return append(a, s...)
}

// TestBenchPeersSmoke runs `vmfork bench peers` once, small, on the real
// guest: a guest filled with data, a live fork, the floor and a kept
// template's warm pool each make a child that is measured, and the run
// leaves nothing behind. The figures themselves are the benchmark's, not a
// test's: only their presence is checked.
func TestBenchPeersSmoke(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	b := newBenchBases(t)
	cmd := b.command(t, "bench", "peers", "--guest", filepath.Dir(e.guest.Kernel), "--memory", "256M",
		"--rounds", "1", "--methods", "vmfork,floor,kept_template", "--no-libvirt", "--guest-use", "40M",
		"--settle", "200ms", "--json")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("vmfork bench peers: %v\n%s\nstderr:\n%s", err, out, stderr)
	}
	var res struct {
		Sizes []struct {
			GuestUseMiB int     `json:"guest_use_mib"`
			KeptPauseMS float64 `json:"kept_pause_ms"`
			Summary     []struct {
				Method    string  `json:"method"`
				Samples   int     `json:"samples"`
				RunningMS float64 `json:"running_ms"`
				ReadyMS   float64 `json:"ready_ms"`
				PSSBytes  int64   `json:"pss_bytes"`
				PoolIdle  int64   `json:"pool_idle_pss_bytes"`
				Phases    struct {
					QEMUStartMS float64 `json:"qemu_start_ms"`
					LoadMS      float64 `json:"load_ms"`
				} `json:"phases"`
			} `json:"summary"`
		} `json:"sizes"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Sizes) != 1 {
		t.Fatalf("bench peers --json: %v\n%s", err, out)
	}
	sz := res.Sizes[0]
	if sz.GuestUseMiB != 40 || sz.KeptPauseMS <= 0 {
		t.Errorf("guest use %d MiB, kept template pause %v ms; want 40 and a measured pause", sz.GuestUseMiB, sz.KeptPauseMS)
	}
	var methods []string
	for _, s := range sz.Summary {
		methods = append(methods, s.Method)
		if s.Samples != 1 || s.RunningMS <= 0 || s.ReadyMS < s.RunningMS || s.PSSBytes <= 0 {
			t.Errorf("%s: %+v, want one sample with running, ready and PSS", s.Method, s)
		}
		// The live fork's phases come from its trace (vmfork.ForkTrace).
		if s.Method == "vmfork" && (s.Phases.QEMUStartMS <= 0 || s.Phases.LoadMS <= 0) {
			t.Errorf("vmfork: phases %+v, want QEMU start and load from the fork's trace", s.Phases)
		}
		if s.Method == "kept_template" && s.PoolIdle <= 0 {
			t.Errorf("kept template: no waiting pool process measured")
		}
	}
	if !slices.Equal(methods, []string{"vmfork", "floor", "kept_template"}) {
		t.Errorf("methods measured: %v", methods)
	}
	waitGoneDirs(t, b)
}

// TestBenchBurstSmoke runs a burst of three children and checks that all
// answered and that the run cleaned up.
func TestBenchBurstSmoke(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	b := newBenchBases(t)
	csvPath := filepath.Join(t.TempDir(), "children.csv")
	out, err := b.command(t, "bench", "burst", "--guest", filepath.Dir(e.guest.Kernel), "--count", "3",
		"--settle", "200ms", "--json", "--csv", csvPath).Output()
	if err != nil {
		t.Fatalf("vmfork bench burst: %v\n%s", err, out)
	}
	var res struct {
		Count         int       `json:"count"`
		Ready         int       `json:"ready"`
		Answered      int       `json:"answered"`
		ReadyAtMS     []float64 `json:"ready_at_ms"`
		TotalPSSBytes int64     `json:"total_pss_bytes"`
		Children      []struct {
			Name      string
			ReadyMS   float64 `json:"ready_ms"`
			ChainCPUS float64 `json:"chain_cpu_s"`
		} `json:"children"`
		CPU struct {
			CPUs        int `json:"cpus"`
			CoreSeconds struct {
				ChainChildren float64 `json:"chain_children"`
			} `json:"core_seconds"`
			Samples []json.RawMessage `json:"samples"`
		} `json:"cpu"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("bench burst --json: %v\n%s", err, out)
	}
	if res.Count != 3 || res.Ready != 3 || res.Answered != 3 || len(res.ReadyAtMS) != 3 || res.TotalPSSBytes <= 0 {
		t.Errorf("burst = %+v, want 3 children ready and answering, with their PSS", res)
	}
	// Each child's timeline, and the CPU its QEMU used until READY: a
	// child that came up ran guest code, so its QEMU used CPU.
	if len(res.Children) != 3 {
		t.Errorf("children timeline: %d rows, want 3", len(res.Children))
	}
	for _, c := range res.Children {
		if c.ReadyMS <= 0 || c.ChainCPUS <= 0 {
			t.Errorf("child %s: READY at %v ms after %v CPU s, want both", c.Name, c.ReadyMS, c.ChainCPUS)
		}
	}
	if len(res.CPU.Samples) == 0 || res.CPU.CPUs <= 0 || res.CPU.CoreSeconds.ChainChildren <= 0 {
		t.Errorf("cpu = %+v, want samples and the starting children's CPU", res.CPU)
	}
	if data, err := os.ReadFile(csvPath); err != nil || strings.Count(string(data), "\n") != 4 {
		t.Errorf("--csv: %v\n%s", err, data)
	}
	waitGoneDirs(t, b)
}

// TestBenchBurstBadInput: a burst whose output files cannot be written is
// refused in one line, exit 2, before anything boots.
func TestBenchBurstBadInput(t *testing.T) {
	parallel(t) // boots nothing
	e := newEnv(t)
	b := newBenchBases(t)
	for _, flag := range []string{"--csv", "--cpu-csv"} {
		cmd := b.command(t, "bench", "burst", "--guest", filepath.Dir(e.guest.Kernel), "--count", "3",
			flag, "/nonexistent-vmfork-dir/out.csv")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%s in a missing directory: %v, want exit 2", flag, err)
		}
		msg := strings.TrimSpace(stderr.String())
		if !strings.Contains(msg, flag+" /nonexistent-vmfork-dir/out.csv: no directory") || strings.Contains(msg, "\n") {
			t.Errorf("%s: stderr %q, want one line naming the file", flag, msg)
		}
	}
	waitGoneDirs(t, b)
}

// waitGoneDirs fails the test if bench run directories under b, or QEMU
// processes using them, are left.
func waitGoneDirs(t *testing.T, b benchBases) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := b.dirs()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("bench left %v", left)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// qemuMentioning lists live QEMU processes whose command line contains s.
func qemuMentioning(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range entries {
		if pid, err := strconv.Atoi(ent.Name()); err == nil && ownedQEMU(pid, s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestBenchStallSmoke runs `vmfork bench stall` small, with its libvirt
// comparator: a source with a port forward to an echo service, a client
// exchanging bytes with it through two rounds of a quiet window, the floor
// and a fork, then two virsh save + restore of a libvirt domain of the same
// guest. The gaps the client saw must cover each pause (a guest that does
// not run cannot echo), and the run must leave no directory, QEMU or
// domain behind.
func TestBenchStallSmoke(t *testing.T) {
	e := newEnv(t)
	b := newBenchBases(t)
	// libvirt's QEMU user must reach the domain's files: a base it can
	// traverse, not t.TempDir's 0700 parents.
	tmp, err := os.MkdirTemp("/var/tmp", "vmfork-benchtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	b.tmp = tmp
	cmd := b.command(t, "bench", "stall", "--guest", filepath.Dir(e.guest.Kernel), "--memory", "256M",
		"--guest-use", "40M", "--rounds", "2", "--tail", "300ms", "--settle", "200ms", "--json")
	out, err := cmd.Output()
	prefix := ""
	if cmd.Process != nil {
		prefix = "vmfork-bench-" + strconv.Itoa(cmd.Process.Pid) + "-"
		// Only if the run died before its own cleanup: its domain goes too.
		t.Cleanup(func() {
			for _, d := range domains(t, prefix) {
				virsh(t, "destroy", d)
			}
		})
	}
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("vmfork bench stall: %v\n%s\nstderr:\n%s", err, out, stderr)
	}
	type gaps struct {
		Replies  int     `json:"replies"`
		MaxGapMS float64 `json:"max_gap_ms"`
		P99GapMS float64 `json:"p99_gap_ms"`
	}
	var res struct {
		IntervalMS float64 `json:"interval_ms"`
		Sizes      []struct {
			GuestUseMiB int `json:"guest_use_mib"`
			Rounds      []struct {
				Quiet             gaps    `json:"quiet"`
				Floor             gaps    `json:"floor"`
				FloorPauseMS      float64 `json:"floor_pause_ms"`
				Fork              gaps    `json:"fork"`
				ForkAcrossPauseMS float64 `json:"fork_gap_across_pause_ms"`
				ForkPauseMS       float64 `json:"fork_pause_ms"`
				RAMMode           string  `json:"ram_mode"`
				CloneMS           float64 `json:"whole_clone_ms"`
				ChildReadyMS      float64 `json:"child_ready_ms"`
			} `json:"rounds"`
			ForkMaxGapMS  float64 `json:"fork_max_gap_ms"`
			FloorMaxGapMS float64 `json:"floor_max_gap_ms"`
			CloneMS       float64 `json:"vmfork_whole_clone_ms"`
			SaveRestoreMS float64 `json:"libvirt_save_restore_ms"`
			Libvirt       []struct {
				ReadyMS float64 `json:"ready_ms"`
			} `json:"libvirt_samples"`
			Ratios []struct {
				Name  string  `json:"name"`
				Value float64 `json:"value"`
				Met   *bool   `json:"met"`
			} `json:"ratios"`
		} `json:"sizes"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Sizes) != 1 {
		t.Fatalf("bench stall --json: %v\n%s", err, out)
	}
	sz := res.Sizes[0]
	if sz.GuestUseMiB != 40 || len(sz.Rounds) != 2 {
		t.Fatalf("guest use %d MiB, %d rounds; want 40 and 2\n%s", sz.GuestUseMiB, len(sz.Rounds), out)
	}
	for i, r := range sz.Rounds {
		// About 500 replies a second at 2 ms; a loaded host answers fewer.
		if r.Quiet.Replies < 20 || r.Floor.Replies < 5 || r.Fork.Replies < 5 {
			t.Errorf("round %d: replies quiet %d, floor %d, fork %d; want the client answered throughout", i+1, r.Quiet.Replies, r.Floor.Replies, r.Fork.Replies)
		}
		if r.FloorPauseMS <= 0 || r.Floor.MaxGapMS < r.FloorPauseMS/2 {
			t.Errorf("round %d: floor paused %.1f ms, client's longest gap %.1f ms; want a gap covering the pause", i+1, r.FloorPauseMS, r.Floor.MaxGapMS)
		}
		if r.ForkPauseMS <= 0 || r.ForkAcrossPauseMS < r.ForkPauseMS/2 || r.Fork.MaxGapMS < r.ForkAcrossPauseMS {
			t.Errorf("round %d: fork paused %.1f ms, gap across it %.1f ms, longest %.1f ms; want gaps covering the pause",
				i+1, r.ForkPauseMS, r.ForkAcrossPauseMS, r.Fork.MaxGapMS)
		}
		if r.Quiet.MaxGapMS < res.IntervalMS || r.Quiet.P99GapMS > r.Quiet.MaxGapMS {
			t.Errorf("round %d: quiet window %+v, want gaps of at least the %.0f ms interval", i+1, r.Quiet, res.IntervalMS)
		}
		if r.RAMMode == "" || r.ChildReadyMS <= 0 || r.CloneMS < r.ChildReadyMS {
			t.Errorf("round %d: RAM mode %q, child ready %.0f ms, whole clone %.0f ms; want the clone to include the child's ready",
				i+1, r.RAMMode, r.ChildReadyMS, r.CloneMS)
		}
	}
	if len(sz.Libvirt) != 2 || sz.SaveRestoreMS <= 0 || sz.CloneMS <= 0 {
		t.Errorf("%d libvirt samples, save + restore %.0f ms, vmfork clone %.0f ms; want 2 and both measured", len(sz.Libvirt), sz.SaveRestoreMS, sz.CloneMS)
	}
	targets := 0
	for _, r := range sz.Ratios {
		if r.Met != nil {
			targets++
			if r.Value <= 0 {
				t.Errorf("target %q has value %v", r.Name, r.Value)
			}
		}
	}
	if targets != 2 {
		t.Errorf("%d targets in %+v, want the stall and the whole clone", targets, sz.Ratios)
	}
	waitGoneDirs(t, b)
	if prefix != "" {
		if left := domains(t, prefix); len(left) > 0 {
			t.Errorf("bench left libvirt domains %v", left)
		}
	}
}

// TestBenchStallLibvirtSmoke runs `vmfork bench stall --driver libvirt`
// small: the source is booted and forked through the libvirt driver, its
// floor is the freeze's own calls through libvirt (suspend, device state
// through QMP passthrough, resume), and the comparator is as for the
// embedded driver. The client's gaps must cover each pause, and the run
// must leave no domain, QEMU or directory behind. Bad driver flags fail
// first, with exit 2.
func TestBenchStallLibvirtSmoke(t *testing.T) {
	e := newEnv(t)
	libvirtSetup(t, e) // the hook runs e.bin, which the run is told of
	b := newBenchBases(t)
	tmp, err := os.MkdirTemp("/var/tmp", "vmfork-benchtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	b.tmp = tmp
	for _, args := range [][]string{{"--driver", "xen"}, {"--driver", "libvirt", "--no-libvirt"}} {
		cmd := b.command(t, append([]string{"bench", "stall", "--guest", filepath.Dir(e.guest.Kernel), "--memory", "256M"}, args...)...)
		out, err := cmd.CombinedOutput()
		if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--driver") {
			t.Errorf("bench stall %v: %v, want exit 2 naming --driver:\n%s", args, err, out)
		}
	}
	cmd := b.command(t, "bench", "stall", "--driver", "libvirt", "--guest", filepath.Dir(e.guest.Kernel), "--memory", "256M",
		"--guest-use", "40M", "--rounds", "2", "--tail", "300ms", "--settle", "200ms", "--json")
	cmd.Env = append(cmd.Env, "VMFORK_LIBVIRT_HOOK_BIN="+e.bin)
	out, err := cmd.Output()
	prefix := ""
	if cmd.Process != nil {
		prefix = "vmfork-bench-" + strconv.Itoa(cmd.Process.Pid) + "-"
		t.Cleanup(func() { removeDomains(t, prefix) })
	}
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("vmfork bench stall --driver libvirt: %v\n%s\nstderr:\n%s", err, out, stderr)
	}
	type gaps struct {
		Replies  int     `json:"replies"`
		MaxGapMS float64 `json:"max_gap_ms"`
	}
	var res struct {
		Driver string `json:"driver"`
		Sizes  []struct {
			Rounds []struct {
				Floor             gaps    `json:"floor"`
				FloorPauseMS      float64 `json:"floor_pause_ms"`
				Fork              gaps    `json:"fork"`
				ForkAcrossPauseMS float64 `json:"fork_gap_across_pause_ms"`
				ForkPauseMS       float64 `json:"fork_pause_ms"`
				RAMMode           string  `json:"ram_mode"`
				CloneMS           float64 `json:"whole_clone_ms"`
				ChildReadyMS      float64 `json:"child_ready_ms"`
			} `json:"rounds"`
			SaveRestoreMS float64 `json:"libvirt_save_restore_ms"`
			Ratios        []struct {
				Name string `json:"name"`
				Met  *bool  `json:"met"`
			} `json:"ratios"`
		} `json:"sizes"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Sizes) != 1 || len(res.Sizes[0].Rounds) != 2 || res.Driver != "libvirt" {
		t.Fatalf("bench stall --driver libvirt --json: %v; want one size, two rounds, driver libvirt\n%s", err, out)
	}
	sz := res.Sizes[0]
	for i, r := range sz.Rounds {
		if r.FloorPauseMS <= 0 || r.Floor.Replies < 5 || r.Floor.MaxGapMS < r.FloorPauseMS/2 {
			t.Errorf("round %d: floor paused %.1f ms, %d replies, longest gap %.1f ms; want a gap covering the pause", i+1, r.FloorPauseMS, r.Floor.Replies, r.Floor.MaxGapMS)
		}
		if r.ForkPauseMS <= 0 || r.Fork.Replies < 5 || r.ForkAcrossPauseMS < r.ForkPauseMS/2 || r.Fork.MaxGapMS < r.ForkAcrossPauseMS {
			t.Errorf("round %d: fork paused %.1f ms, gap across it %.1f ms, longest %.1f ms; want gaps covering the pause",
				i+1, r.ForkPauseMS, r.ForkAcrossPauseMS, r.Fork.MaxGapMS)
		}
		if r.RAMMode == "" || r.ChildReadyMS <= 0 || r.CloneMS < r.ChildReadyMS {
			t.Errorf("round %d: RAM mode %q, child ready %.0f ms, whole clone %.0f ms; want the clone to include the child's ready", i+1, r.RAMMode, r.ChildReadyMS, r.CloneMS)
		}
	}
	targets := 0
	for _, r := range sz.Ratios {
		if r.Met != nil {
			targets++
		}
	}
	if sz.SaveRestoreMS <= 0 || targets != 2 {
		t.Errorf("save + restore %.0f ms, %d targets; want both measured", sz.SaveRestoreMS, targets)
	}
	waitGoneDirs(t, b)
	if left := domains(t, prefix); len(left) > 0 {
		t.Errorf("bench left libvirt domains %v", left)
	}
}
