package qemudrv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qmp"
)

// A stub QEMU on PATH answers the three questions the host check asks.
func TestHostManifest(t *testing.T) {
	dir := t.TempDir()
	stub := filepath.Join(dir, "qemu-stub")
	marker := filepath.Join(dir, "broken")
	script := `#!/bin/sh
[ -e ` + marker + ` ] && exit 1
case "$1" in
--version) echo "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7)";;
-machine) printf 'Supported machines are:\npc-q35-7.2           Standard PC (Q35 + ICH9, 2009)\n';;
-cpu) printf 'Available CPUs:\nx86 qemu64                (alias configured by machine type)\nx86 max\n';;
esac
`
	if err := os.WriteFile(stub, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := New(logrus.NewEntry(logrus.New()))
	d.QEMU = stub
	tpl := &vmfork.Template{ID: "web.1", Accel: AccelTCG, Paths: vmfork.TemplatePaths{Dir: t.TempDir()}, Spec: vmfork.Spec{
		Kernel: "/k", MemoryMiB: 256, CPUs: 1, MachineType: "pc-q35-7.2", CPUModel: "qemu64", MAC: "52:54:00:12:34:56",
	}}
	got, err := d.HostManifest(t.Context(), tpl)
	if err != nil {
		t.Fatal(err)
	}
	want := manifestOf(&vmfork.Machine{Accel: AccelTCG, Spec: tpl.Spec}, qmpGreeting(7, 2, 22))
	if err := got.Check(want); err != nil || got.QEMUVersion != "7.2.22" {
		t.Errorf("host manifest %+v: %v, want %+v", got, err, want)
	}
	// A later command (an empty in-process cache) asks no QEMU while the
	// binary is the same file, and asks again once it is replaced.
	os.WriteFile(marker, nil, 0o600)
	clear(hostCache)
	if _, err := d.HostManifest(t.Context(), tpl); err != nil {
		t.Errorf("cached answer not used: %v", err)
	}
	clear(hostCache)
	os.WriteFile(stub, []byte(script+"\n"), 0o755)
	if _, err := d.HostManifest(t.Context(), tpl); err == nil {
		t.Errorf("a replaced QEMU binary was not asked again")
	}
	os.Remove(marker)
	tpl.Spec.MachineType, tpl.Spec.CPUModel = "pc-q35-9.0", "Skylake-Server"
	if got, _ := d.HostManifest(t.Context(), tpl); got.MachineType != "" || got.CPUModel != "" {
		t.Errorf("a machine type and CPU model the stub lacks came back as %q, %q; want both empty", got.MachineType, got.CPUModel)
	}
}

func qmpGreeting(major, minor, micro int) qmp.Greeting {
	var g qmp.Greeting
	g.Version.QEMU.Major, g.Version.QEMU.Minor, g.Version.QEMU.Micro = major, minor, micro
	return g
}
