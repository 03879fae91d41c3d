package qemudrv

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/vmfork/vmfork/qmp/qmptest"
)

// fakeSpawn makes d's spawn start q instead of a QEMU, and records the
// argv. The process q ends when it gets a signal it does not survive.
func fakeSpawn(t *testing.T, d *Driver, q *fakeQEMU, argv *[]string) {
	d.procs.spawn = func(bin string, args []string, logPath string, opt spawnOptions) (*process, error) {
		*argv = append([]string{bin}, args...)
		p := &process{pid: fakePID, done: make(chan struct{})}
		var once sync.Once
		p.signal = func(pid int, sig syscall.Signal) error {
			err := d.procs.signal(pid, sig)
			if !q.alive() {
				once.Do(func() { close(p.done) })
			}
			return err
		}
		return p, nil
	}
}

// A prestart that fails after QEMU started (here: the QEMU's version is not
// the template's) kills that QEMU, waits for it, and leaves no PID in the
// record and no start RAM file beside the template.
func TestPrestartFailureKillsTheChild(t *testing.T) {
	q := newFakeQEMU()
	d := testDriver(t, q)
	d.QEMU = "true" // found on PATH; never run: spawn is faked
	var argv []string
	fakeSpawn(t, d, q, &argv)
	sock := qmpServerNoCommands(t) // greeting only: QEMU 7.2.22
	m := fakeMachine(t, "web-1", sock, "")
	tpl := fakeTemplate(t)
	tpl.Manifest.QEMUVersion = "8.2.0"
	err := d.Prestart(t.Context(), m, tpl)
	if err == nil || !strings.Contains(err.Error(), "8.2.0") {
		t.Fatalf("Prestart: got %v, want an error naming the template's QEMU version", err)
	}
	if !slices.Contains(argv, "defer") {
		t.Errorf("QEMU argv %q: want -incoming defer", argv)
	}
	if got := q.signals(); !slices.Equal(got, []syscall.Signal{syscall.SIGKILL}) {
		t.Errorf("signals sent: got %v, want [SIGKILL]", got)
	}
	if m.PID != 0 {
		t.Errorf("record keeps PID %d of a killed QEMU", m.PID)
	}
	left, _ := filepath.Glob(filepath.Join(tpl.Paths.Dir, "."+tpl.ID+ramSuffix+".tmp-start-*"))
	if len(left) > 0 {
		t.Errorf("start RAM files left: %q", left)
	}
}

// qmpServerNoCommands is a QMP fake that only greets: any command fails the
// test.
func qmpServerNoCommands(t *testing.T) string { return qmptest.NewServer(t) }
