package qemudrv

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
)

// fakePID is the PID of every fake QEMU. The fakes never signal a real
// process: signal only records.
const fakePID = 1 << 30

// fakeQEMU is one QEMU process as the driver sees it through procs: alive
// until it is told to exit, or until a signal it does not survive.
type fakeQEMU struct {
	mu      sync.Mutex
	running bool
	sigs    []syscall.Signal
	// survives lists the signals it lives through (SIGKILL: a process
	// stuck in the kernel).
	survives []syscall.Signal
	// args are markers its command line has beside its QMP socket (alive
	// finds only those), such as qemustate.DevicesOnlyArgs.
	args []string
}

func newFakeQEMU() *fakeQEMU { return &fakeQEMU{running: true} }

func (f *fakeQEMU) exit() {
	f.mu.Lock()
	f.running = false
	f.mu.Unlock()
}

func (f *fakeQEMU) alive() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running
}

func (f *fakeQEMU) signals() []syscall.Signal {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sigs)
}

// testDriver returns a driver whose processes are q, with waits short
// enough for a unit test.
func testDriver(t *testing.T, q *fakeQEMU) *Driver {
	d := New(nil)
	d.StopGrace, d.AgentTimeout = 300*time.Millisecond, 300*time.Millisecond
	d.procs = procs{
		spawn: func(string, []string, string, spawnOptions) (*process, error) {
			t.Errorf("unexpected QEMU spawn")
			return nil, syscall.ENOSYS
		},
		alive: func(pid int, marker string) bool {
			// Any marker is the QMP socket's path, but for QEMU arguments
			// the fake was not started with.
			return pid == fakePID && q.alive() && (!strings.HasPrefix(marker, "migration.") || slices.Contains(q.args, marker))
		},
		signal: func(pid int, sig syscall.Signal) error {
			if pid != fakePID {
				t.Errorf("signal %v sent to pid %d, want the fake's %d", sig, pid, fakePID)
				return syscall.ESRCH
			}
			q.mu.Lock()
			defer q.mu.Unlock()
			q.sigs = append(q.sigs, sig)
			if !slices.Contains(q.survives, sig) {
				q.running = false
			}
			return nil
		},
		quitGrace: 300 * time.Millisecond, killGrace: 300 * time.Millisecond,
	}
	return d
}

// fakeMachine is a running machine on the QMP and agent sockets given
// ("" for a path where nothing listens).
func fakeMachine(t *testing.T, name, qmpSock, qgaSock string) *vmfork.Machine {
	dir := t.TempDir()
	if qmpSock == "" {
		qmpSock = filepath.Join(dir, "qmp.sock")
	}
	if qgaSock == "" {
		qgaSock = filepath.Join(dir, "qga.sock")
	}
	return &vmfork.Machine{
		Name: name, Driver: Name, State: vmfork.StateRunning, PID: fakePID,
		Spec: vmfork.Spec{MemoryMiB: 64, CPUs: 1},
		Paths: vmfork.Paths{
			Dir: dir, QMP: qmpSock, QGA: qgaSock,
			Serial: filepath.Join(dir, "serial.log"), Log: filepath.Join(dir, "qemu.log"),
			RAM: filepath.Join(dir, name+ramSuffix),
		},
	}
}
