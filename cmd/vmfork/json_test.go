package main

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
)

var update = flag.Bool("update", false, "rewrite golden files")

// The CLI's JSON is the contract with scripts and the Ansible modules:
// these golden files change only by adding keys.
func TestJSONGolden(t *testing.T) {
	m := &vmfork.Machine{
		Name: "web-1", Driver: "qemu", State: vmfork.StateRunning, PID: 4242, Accel: "tcg",
		Spec: vmfork.Spec{
			Kernel: "/srv/vmlinuz", Disk: "/srv/base.qcow2", MemoryMiB: 512, CPUs: 2,
			Ports: []vmfork.PortForward{{Host: 40022, Guest: 22}}, MAC: "52:54:00:12:34:56",
		},
		Paths: vmfork.Paths{
			Dir: "/s/machines/web-1", Disk: "/s/machines/web-1/disk.qcow2",
			QMP: "/s/machines/web-1/qmp.sock", QGA: "/s/machines/web-1/qga.sock",
			Serial: "/s/machines/web-1/serial.log", Log: "/s/machines/web-1/qemu.log",
			RAM: "/dev/shm/vmfork/web.1.ram",
		},
		Parent: "web", Template: "web.1", Created: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
		Identity: &vmfork.IdentityResult{Hostname: "web-1", Addresses: []string{"10.0.2.16/24"}},
	}
	tpl := vmfork.TemplateStatus{
		Name: "golden", ID: "web.2", Source: "web", Created: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
		MemoryMiB: 512, HasMemory: true, RAMBytes: 130 << 20, PauseMS: 70.5, Children: 3, PoolSize: 4, Pooled: 4,
	}
	fork := &vmfork.ForkResult{
		Source: "web", Template: "web.1", PauseMS: 68.5,
		Children: []vmfork.ChildResult{{
			Name: "web-1", PID: 4242, State: vmfork.StateRunning,
			Ports: []vmfork.PortForward{{Host: 40022, Guest: 22}}, RunningMS: 67.1, ReadyMS: 185.2,
		}},
		Failed: []vmfork.ChildError{{Name: "web-2", Error: "QEMU exited: boom"}},
	}
	for name, v := range map[string]any{"ls.json": []machineView{viewOf(m)}, "fork.json": fork, "template-ls.json": []vmfork.TemplateStatus{tpl}} {
		checkGolden(t, name, v)
	}
}

// checkGolden compares v's indented JSON with testdata/name; -update
// rewrites the file.
func checkGolden(t *testing.T, name string, v any) {
	t.Helper()
	got, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/vmfork -update)", err)
	}
	if string(got)+"\n" != string(want) {
		t.Errorf("%s changed (rerun with -update and review the diff):\ngot:\n%s\nwant:\n%s", name, got, want)
	}
}
