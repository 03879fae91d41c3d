//go:build integration

package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmfork/vmfork/internal/proc"
)

// guest is the built test guest.
type guest struct {
	Kernel, Initrd, Disk, KernelRelease string
}

func testGuest(t testing.TB) guest {
	t.Helper()
	dir := os.Getenv("VMFORK_GUEST")
	if dir == "" {
		t.Fatal("VMFORK_GUEST is not set: run the integration tests with `make integration`")
	}
	g := guest{
		Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.gz"),
		Disk:   filepath.Join(dir, "data.qcow2"),
	}
	rel, err := os.ReadFile(filepath.Join(dir, "kernel-release"))
	if err != nil {
		t.Fatalf("test guest not built (make guest): %v", err)
	}
	g.KernelRelease = strings.TrimSpace(string(rel))
	return g
}

// env is one test's vmfork installation: its own state and mem dirs, removed
// with every QEMU process started in them when the test ends, pass or fail.
type env struct {
	t        testing.TB
	bin      string
	stateDir string
	memDir   string
	guest    guest
	// extraEnv is added to the environment of every vmfork this env runs
	// (withEnv): a test that runs in parallel cannot t.Setenv.
	extraEnv []string
	// debianImported: the shared Debian template is imported into this
	// store (harness_shared_test.go, env.forkDebian).
	debianImported bool
	// runAs, when set, is the command that runs vmfork as another user
	// (setpriv ..., unpriv_test.go); extraEnv does not pass through it.
	runAs []string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvGuest(t, testGuest(t))
}

// newEnvGuest is newEnv for another guest than the busybox test guest.
func newEnvGuest(t testing.TB, g guest) *env {
	t.Helper()
	bin := os.Getenv("VMFORK_BIN")
	if bin == "" {
		t.Fatal("VMFORK_BIN is not set: run the integration tests with `make integration`")
	}
	memDir, err := os.MkdirTemp("/dev/shm", "vmfork-test-")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, bin: bin, stateDir: t.TempDir(), memDir: memDir, guest: g}
	t.Cleanup(e.cleanup)
	return e
}

// withEnv returns a copy of e whose vmfork commands run with the
// environment variables kv ("NAME=VALUE") added; e itself is unchanged.
func (e *env) withEnv(kv ...string) *env {
	f := *e
	f.extraEnv = append(slices.Clone(e.extraEnv), kv...)
	return &f
}

// result is one vmfork invocation.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return "exit " + strconv.Itoa(r.code) + ", stdout " + strconv.Quote(r.stdout) + ", stderr " + strconv.Quote(r.stderr)
}

// vmfork runs the CLI with this env's dirs.
func (e *env) vmfork(args ...string) result {
	e.t.Helper()
	return e.vmforkIn("", args...)
}

// vmforkIn runs the CLI with this env's dirs and stdin as its standard input.
func (e *env) vmforkIn(stdin string, args ...string) result {
	e.t.Helper()
	argv := append([]string{e.bin, "--state-dir", e.stateDir, "--mem-dir", e.memDir}, args...)
	if len(e.runAs) > 0 {
		argv = append(slices.Clone(e.runAs), argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &out, &errb
	if len(e.extraEnv) > 0 {
		cmd.Env = append(os.Environ(), e.extraEnv...)
	}
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		e.t.Fatalf("run vmfork %v: %v", args, err)
	}
	return r
}

// ok runs the CLI and fails the test unless it exits 0.
func (e *env) ok(args ...string) result {
	e.t.Helper()
	r := e.vmfork(args...)
	if r.code != 0 {
		e.t.Fatalf("vmfork %s: %s", strings.Join(args, " "), r)
	}
	return r
}

// jsonOK runs the CLI with --json and decodes stdout into v.
func (e *env) jsonOK(v any, args ...string) {
	e.t.Helper()
	r := e.ok(append(args, "--json")...)
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		e.t.Fatalf("vmfork %s --json: stdout is not JSON: %v\n%s", strings.Join(args, " "), err, r.stdout)
	}
}

// boot boots the test guest as name with extra flags.
func (e *env) boot(name string, extra ...string) machineJSON {
	e.t.Helper()
	var m machineJSON
	args := append([]string{"boot", name, "--kernel", e.guest.Kernel, "--initrd", e.guest.Initrd,
		"--disk", e.guest.Disk, "--memory", "256M"}, extra...)
	e.jsonOK(&m, args...)
	return m
}

// exec runs a command in machine name and returns its stdout; it fails the
// test unless the command exits 0.
func (e *env) exec(name string, argv ...string) string {
	e.t.Helper()
	return e.ok(append([]string{"exec", name, "--"}, argv...)...).stdout
}

type machineJSON struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	PID       int    `json:"pid"`
	MemoryMiB int    `json:"memory_mib"`
	CPUs      int    `json:"cpus"`
	Parent    string `json:"parent"`
	Template  string `json:"template"`
	QMP       string `json:"qmp_socket"`
	QGA       string `json:"qga_socket"`
	Serial    string `json:"serial_log"`
	Disk      string `json:"disk"`
	RAM       string `json:"ram_file"`
	MAC       string `json:"mac"`
	Hostname  string `json:"hostname"`
	// StopReason: why a stopped machine is stopped (user, qemu-died,
	// host-restart).
	StopReason string `json:"stop_reason"`
	Ports      []struct {
		Host  int `json:"host"`
		Guest int `json:"guest"`
	} `json:"ports"`
}

func (e *env) list() []machineJSON {
	e.t.Helper()
	var ms []machineJSON
	e.jsonOK(&ms, "ls")
	return ms
}

// cleanup kills every QEMU process started with this env's state dir (found by
// PID in the machine and warm-pool records and checked against its command line), then
// removes the dirs.
func (e *env) cleanup() {
	recs, _ := filepath.Glob(filepath.Join(e.stateDir, "machines", "*", "machine.json"))
	members, _ := filepath.Glob(filepath.Join(e.stateDir, "pool", "*", "*", "member.json"))
	for _, rec := range append(recs, members...) {
		var m struct {
			PID int `json:"pid"`
		}
		data, err := os.ReadFile(rec)
		if err != nil || json.Unmarshal(data, &m) != nil {
			continue
		}
		if ownedQEMU(m.PID, e.stateDir) {
			syscall.Kill(m.PID, syscall.SIGKILL)
			waitExit(m.PID, e.stateDir, 10*time.Second)
		}
	}
	// The family ledger's server, which the first machine started: it
	// would otherwise outlive the test by a minute or two.
	if pid := e.ledgerServerPID(); pid > 0 {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	os.RemoveAll(e.memDir)
}

// ledgerServerPID is the PID of this env's `vmfork ledger-server`, 0 for
// none (checked against its command line: a PID file can be stale).
func (e *env) ledgerServerPID() int {
	data, err := os.ReadFile(filepath.Join(e.stateDir, "ledger", "server.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !bytes.Contains(cmdline, []byte(e.stateDir)) || !bytes.Contains(cmdline, []byte("ledger-server")) || !proc.Running(pid) {
		return 0
	}
	return pid
}

// ownedQEMU reports whether pid is a live QEMU started with our state dir.
func ownedQEMU(pid int, stateDir string) bool {
	if !proc.Alive(pid, stateDir) {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	argv0, _, _ := bytes.Cut(cmdline, []byte{0})
	return err == nil && bytes.Contains(argv0, []byte("qemu-system"))
}

func waitExit(pid int, stateDir string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for ownedQEMU(pid, stateDir) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// qemuProcesses lists the live QEMU processes started with this env's state dir.
func (e *env) qemuProcesses() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err == nil && ownedQEMU(pid, e.stateDir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func jsonDecode(s string, v any) error { return json.Unmarshal([]byte(s), v) }
