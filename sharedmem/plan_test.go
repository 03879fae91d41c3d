//go:build linux && amd64

package sharedmem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeMonitor stands for QEMU's QMP: add-fd answers with the descriptor the
// helper process already holds (a fake cannot pass one into it), or fails.
type fakeMonitor struct {
	fd      int
	addFail error
	cmds    []string
	// pid, when set, is a helper holding the files add-fd hands over:
	// each gets the helper's own descriptor of that file (FDOf).
	pid int
}

func (m *fakeMonitor) Execute(_ context.Context, cmd string, _, _ any) error {
	m.cmds = append(m.cmds, cmd)
	return nil
}

func (m *fakeMonitor) ExecuteWithFile(_ context.Context, cmd string, _ any, f *os.File, result any) error {
	m.cmds = append(m.cmds, cmd)
	if m.addFail != nil {
		return m.addFail
	}
	fd := m.fd
	if m.pid != 0 {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return err
		}
		var err error
		if fd, err = FDOf(m.pid, st.Dev, st.Ino); err != nil {
			return err
		}
	}
	return json.Unmarshal([]byte(fmt.Sprintf(`{"fdset-id": 3, "fd": %d}`, fd)), result)
}

func planRequest(pid int, own, dir string) PlanRequest {
	return PlanRequest{
		PID: pid, SizeBytes: helperPages * pageSize, Shared: true, RAM: own, Own: own,
		Template: filepath.Join(dir, "t.ram"), Temp: filepath.Join(dir, ".t.ram.tmp"), Suffix: ".ram",
	}
}

func rootOnly(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test traces another process: run it as root, as CI does")
	}
}

// TestPlanFirst freezes a running process's shared RAM file into a template
// with nothing copied: the template is the file itself, the process's later
// writes never reach it, and its writes before the pause are in it.
func TestPlanFirst(t *testing.T) {
	rootOnly(t)
	dir := t.TempDir()
	a := filepath.Join(dir, "a.ram")
	fillFile(t, a, 'a')
	// The helper's second descriptor is a's, read-only: what add-fd gives
	// QEMU in this mode.
	h := startHelper(t, a, a)
	mon := &fakeMonitor{fd: h.fd}
	req := planRequest(h.cmd.Process.Pid, a, dir)
	p, err := Prepare(t.Context(), mon, req)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup(t.Context(), mon)
	if p.Mode != First || p.Precopied != 0 {
		t.Fatalf("plan of a shared RAM file: mode %v, %d bytes precopied; want first, 0", p.Mode, p.Precopied)
	}
	h.ask("set 2 7") // the guest runs on between Prepare and the pause
	n, err := p.InPause(t.Context(), &PauseWindow{})
	if err != nil || n != 0 {
		t.Fatalf("InPause = %d, %v; want 0 bytes copied", n, err)
	}
	if inodeOf(t, req.Template) != inodeOf(t, a) {
		t.Errorf("template is not the source's file")
	}
	if fi, err := os.Stat(req.Template); err != nil || fi.Mode().Perm() != 0o400 {
		t.Errorf("template mode %v (%v), want 0400", fi.Mode(), err)
	}
	h.ask("set 3 9")
	data, _ := os.ReadFile(req.Template)
	if data[2*pageSize] != 7 || data[3*pageSize] != 'a' {
		t.Errorf("template holds %d at page 2 and %d at page 3; want 7 (written before the pause) and 'a' (the write after it is private)", data[2*pageSize], data[3*pageSize])
	}
	if got := h.ask("get 3"); got != "9" {
		t.Errorf("the process lost its write after the freeze: page 3 reads %s", got)
	}
	p.Cleanup(t.Context(), mon)
	if !slices.Contains(mon.cmds, "remove-fd") {
		t.Errorf("QMP commands %v: the passed descriptor was not released", mon.cmds)
	}
}

// TestPlanRollback: a plan that fails before the pause leaves no file and
// the process's RAM as it was, for a first freeze and for a later one whose
// copy was made already.
func TestPlanRollback(t *testing.T) {
	rootOnly(t)
	dir := t.TempDir()
	a := filepath.Join(dir, "a.ram")
	fillFile(t, a, 'a')
	h := startHelper(t, a, a)
	pid := h.cmd.Process.Pid
	req := planRequest(pid, a, dir)
	failing := &fakeMonitor{addFail: errors.New("add-fd refused")}
	if _, err := Prepare(t.Context(), failing, req); err == nil {
		t.Fatal("Prepare with add-fd failing succeeded")
	}
	if m, err := FindRAM(pid, helperPages*pageSize, ".ram", 0); err != nil || !m.Shared {
		t.Fatalf("after a failed plan the RAM mapping is %+v (%v), want a's, shared", m, err)
	}
	h.ask("set 1 5")
	if data, _ := os.ReadFile(a); data[pageSize] != 5 {
		t.Fatalf("after a failed plan the process's writes no longer reach its file")
	}

	// Freeze once, keep the template (a child maps it), then fail the next
	// plan after its copy was made: the copy goes.
	mon := &fakeMonitor{fd: h.fd}
	p, err := Prepare(t.Context(), mon, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.InPause(t.Context(), &PauseWindow{}); err != nil {
		t.Fatal(err)
	}
	p.Cleanup(t.Context(), mon)
	h.ask("set 4 6")
	req2 := req
	req2.Template, req2.Temp = filepath.Join(dir, "t2.ram"), filepath.Join(dir, ".t2.ram.tmp")
	if _, err := Prepare(t.Context(), failing, req2); err == nil {
		t.Fatal("second Prepare with add-fd failing succeeded")
	}
	for _, f := range []string{req2.Temp, req2.Template} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left by a failed plan (%v)", f, err)
		}
	}
	if got := h.ask("get 4"); got != "6" {
		t.Errorf("after a failed plan page 4 reads %s, want its write 6", got)
	}
	if data, _ := os.ReadFile(req.Template); data[4*pageSize] != 'a' {
		t.Errorf("the first template changed")
	}
}

// TestPlanStreamAndCopy: a QEMU whose RAM block is share=off gets an empty
// template file of its size (the device state carries RAM); a shared file
// on another file system than the templates' is copied in the pause, and
// the plan says why.
func TestPlanStreamAndCopy(t *testing.T) {
	rootOnly(t)
	dir := t.TempDir()
	mon := &fakeMonitor{}
	p, err := Prepare(t.Context(), mon, PlanRequest{SizeBytes: 1 << 20, Template: filepath.Join(dir, "s.ram")})
	if err != nil || p.Mode != Stream {
		t.Fatalf("Prepare share=off = %+v, %v; want stream", p, err)
	}
	if n, err := p.InPause(t.Context(), &PauseWindow{}); err != nil || n != 0 {
		t.Fatalf("InPause = %d, %v", n, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "s.ram")); err != nil || fi.Size() != 1<<20 {
		t.Errorf("stream template: %v, %v; want a 1 MiB file", fi, err)
	}
	if len(mon.cmds) != 0 {
		t.Errorf("stream plan ran QMP commands %v", mon.cmds)
	}

	shm, err := os.MkdirTemp("/dev/shm", "plan-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	a := filepath.Join(shm, "a.ram")
	fillFile(t, a, 'a')
	if inodeDev(t, shm) == inodeDev(t, dir) {
		t.Fatalf("%s and %s are on one file system: this test needs two", shm, dir)
	}
	h := startHelper(t, a, a)
	p, err = Prepare(t.Context(), mon, planRequest(h.cmd.Process.Pid, a, dir))
	if err != nil || p.Mode != Copy || p.CopyReason == nil {
		t.Fatalf("Prepare across file systems = %+v, %v; want copy, with a reason", p, err)
	}
	if n, err := p.InPause(t.Context(), &PauseWindow{}); err != nil || n != helperPages*pageSize {
		t.Errorf("InPause = %d, %v; want the whole file (%d) copied", n, err, helperPages*pageSize)
	}
	if got := h.ask("get 0"); got != strconv.Itoa('a') {
		t.Errorf("copy plan changed the process's RAM: page 0 reads %s", got)
	}
}

func inodeDev(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(fi.Sys().(*syscall.Stat_t).Dev)
}

// TestPlanTemplateUndone: a step after the RAM that fails takes the
// template's RAM file away with the rest of the freeze (the window's undo
// stack), and the source is resumed.
func TestPlanTemplateUndone(t *testing.T) {
	dir := t.TempDir()
	resumed := 0
	w, err := Pause(t.Context(), PauseSource{
		Pause:       func(context.Context) error { return nil },
		Resume:      func(context.Context) error { resumed++; return nil },
		StillPaused: errStillPaused,
	})
	if err != nil {
		t.Fatal(err)
	}
	tpl := filepath.Join(dir, "t.ram")
	p, err := Prepare(t.Context(), &fakeMonitor{}, PlanRequest{SizeBytes: 1 << 20, Template: tpl})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.InPause(t.Context(), w); err != nil {
		t.Fatal(err)
	}
	err = errors.New("a later step failed")
	w.Rollback(t.Context(), &err)
	if _, serr := os.Stat(tpl); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("template RAM file after the rollback: %v, want it gone", serr)
	}
	if resumed != 1 {
		t.Errorf("source resumed %d times, want 1", resumed)
	}
}
