package qemudrv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// diskOnlySource returns a running machine on QMP socket sock with a qcow2
// disk, and a fresh template for it.
func diskOnlySource(t *testing.T, sock string) (*vmfork.Machine, *vmfork.Template) {
	t.Helper()
	m := fakeMachine(t, "web", sock, "")
	base := filepath.Join(t.TempDir(), "base.qcow2")
	if err := overlay.CreateEmpty(t.Context(), 1<<20, base); err != nil {
		t.Fatalf("qemu-img (make deps installs qemu-utils): %v", err)
	}
	m.Spec.Disk = base
	m.Paths.Disk = filepath.Join(m.Paths.Dir, "disk.qcow2")
	if err := overlay.Create(t.Context(), base, m.Paths.Disk); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	return m, &vmfork.Template{ID: "web.1", Source: "web", Driver: Name, Paths: vmfork.TemplatePaths{Dir: dir, Disk: filepath.Join(dir, "disk.qcow2")}}
}

var diskQuery = qmptest.Expect("query-block").Return([]map[string]any{
	{"qdev": "/machine/peripheral/disk0/virtio-backend", "inserted": map[string]any{"node-name": "n0"}},
})

// SwitchDisks opens the next overlay and switches onto it with the vCPUs
// running: the script has no stop and no cont, and a command it does not
// expect fails the test.
func TestSwitchDisksNoPause(t *testing.T) {
	sock := qmptest.NewServer(t,
		diskQuery,
		qmptest.Expect("blockdev-add"),
		qmptest.Expect("blockdev-snapshot"),
	)
	m, tpl := diskOnlySource(t, sock)
	old := m.Paths.Disk
	if err := testDriver(t, newFakeQEMU()).SwitchDisks(t.Context(), m, tpl); err != nil {
		t.Fatalf("SwitchDisks: %v", err)
	}
	if m.Paths.Disk == old {
		t.Errorf("source disk still %s, want the new overlay", old)
	}
	if _, err := os.Stat(tpl.Paths.Disk); err != nil {
		t.Errorf("template disk: %v", err)
	}
	chain, err := overlay.Chain(m.Paths.Disk)
	if err != nil || len(chain) < 2 || chain[1].Path != tpl.Paths.Disk {
		t.Errorf("the source's new top %+v (%v): want it on the template's disk", chain, err)
	}
}

// A switch QEMU refuses leaves the source on its disk: the template's name
// for it goes, and the unused overlay node and file too.
func TestSwitchDisksFailure(t *testing.T) {
	sock := qmptest.NewServer(t,
		diskQuery,
		qmptest.Expect("blockdev-add"),
		qmptest.Expect("blockdev-snapshot").Fail("GenericError", "injected"),
		qmptest.Expect("blockdev-del"),
	)
	m, tpl := diskOnlySource(t, sock)
	old := m.Paths.Disk
	err := testDriver(t, newFakeQEMU()).SwitchDisks(t.Context(), m, tpl)
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("SwitchDisks: %v, want QEMU's error", err)
	}
	if m.Paths.Disk != old {
		t.Errorf("source disk %s, want %s", m.Paths.Disk, old)
	}
	if _, err := os.Stat(tpl.Paths.Disk); !os.IsNotExist(err) {
		t.Errorf("template disk after a failed switch: %v, want none", err)
	}
	if tops, _ := filepath.Glob(filepath.Join(m.Paths.Dir, "*.qcow2")); len(tops) != 1 {
		t.Errorf("disk files left: %v, want the source's one", tops)
	}
}
