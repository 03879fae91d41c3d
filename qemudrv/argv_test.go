package qemudrv

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
)

var update = flag.Bool("update", false, "rewrite golden files")

func testMachine() *vmfork.Machine {
	return &vmfork.Machine{
		Name:  "web",
		Accel: AccelTCG,
		Spec: vmfork.Spec{
			Kernel: "/srv/vmlinuz", Initrd: "/srv/initrd.gz", Append: "console=ttyS0 quiet",
			Disk: "/srv/base.qcow2", MemoryMiB: 256, CPUs: 2,
			Ports:       []vmfork.PortForward{{Host: 2222, Guest: 22}},
			MachineType: "pc-q35-7.2", CPUModel: "qemu64", MAC: "52:54:00:12:34:56",
			LedgerPort: true,
		},
		Paths: vmfork.Paths{
			Dir: "/var/lib/vmfork/machines/web", Disk: "/var/lib/vmfork/machines/web/disk.qcow2",
			QMP: "/var/lib/vmfork/machines/web/qmp.sock", QGA: "/var/lib/vmfork/machines/web/qga.sock",
			Serial: "/var/lib/vmfork/machines/web/serial.log", Log: "/var/lib/vmfork/machines/web/qemu.log",
			RAM: "/dev/shm/vmfork/web.ram", RAMShared: true,
			Ledger: "/var/lib/vmfork/machines/web/ledger.sock",
		},
	}
}

func TestArgvGolden(t *testing.T) {
	kvm := testMachine()
	kvm.Accel = AccelKVM
	child := testMachine()
	child.Name = "web-1"
	child.Paths.RAM, child.Paths.RAMShared = "/dev/shm/vmfork/t-1.ram", false
	diskless := testMachine()
	diskless.Spec.Disk, diskless.Spec.Initrd, diskless.Spec.Append, diskless.Spec.Ports = "", "", "", nil
	commaPath := testMachine()
	commaPath.Paths.QMP = "/tmp/a,b/qmp.sock"
	bridge := testMachine()
	bridge.Spec.Ports, bridge.Spec.Network = nil, vmfork.Network{Kind: vmfork.NetworkBridge, Name: "br0"}
	bridgeChild := testMachine()
	bridgeChild.Name, bridgeChild.Spec = "web-1", bridge.Spec
	bridgeChild.Paths.RAM, bridgeChild.Paths.RAMShared = "/dev/shm/vmfork/t-1.ram", false
	none := testMachine()
	none.Spec.Ports, none.Spec.Network = nil, vmfork.Network{Kind: vmfork.NetworkNone}
	// A machine (or a template's child) from before the ledger port.
	noLedger := testMachine()
	noLedger.Spec.LedgerPort, noLedger.Paths.Ledger = false, ""

	cases := []struct {
		name string
		m    *vmfork.Machine
		opt  ArgvOptions
	}{
		{"boot-tcg", testMachine(), ArgvOptions{}},
		{"boot-kvm", kvm, ArgvOptions{}},
		{"child-incoming", child, ArgvOptions{Incoming: true}},
		{"child-devices-only", child, ArgvOptions{Incoming: true, DevicesOnly: true}},
		{"diskless", diskless, ArgvOptions{}},
		{"comma-path", commaPath, ArgvOptions{}},
		{"bridge", bridge, ArgvOptions{}},
		{"bridge-child", bridgeChild, ArgvOptions{Incoming: true}},
		{"network-none", none, ArgvOptions{}},
		{"no-ledger-port", noLedger, ArgvOptions{Incoming: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := strings.Join(Argv(c.m, c.opt), "\n") + "\n"
			path := filepath.Join("testdata", c.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./qemudrv -update)", err)
			}
			if got != string(want) {
				t.Errorf("argv differs from %s (rerun with -update and review the diff):\ngot:\n%s\nwant:\n%s", path, got, want)
			}
		})
	}
}

// TestArgvChildMatchesParent checks the rule that makes forking work: a child's
// command line differs from its parent's only in backends (paths, ports,
// share=off) and -incoming, never in the guest-visible configuration.
func TestArgvChildMatchesParent(t *testing.T) {
	parent := testMachine()
	child := testMachine()
	child.Name = "web-1"
	child.Paths = vmfork.Paths{
		Dir: "/x/web-1", Disk: "/x/web-1/disk.qcow2", QMP: "/x/web-1/qmp.sock", QGA: "/x/web-1/qga.sock",
		Serial: "/x/web-1/serial.log", Log: "/x/web-1/qemu.log", RAM: "/dev/shm/vmfork/t.ram",
	}
	child.Spec.Ports = []vmfork.PortForward{{Host: 40000, Guest: 22}}
	child.GuestMAC = "52:54:00:aa:bb:cc"
	pv, cv := GuestVisible(Argv(parent, ArgvOptions{})), GuestVisible(Argv(child, ArgvOptions{Incoming: true}))
	if strings.Join(pv, "\n") != strings.Join(cv, "\n") {
		t.Errorf("guest-visible configuration differs:\nparent: %q\nchild:  %q", pv, cv)
	}
	if argv := strings.Join(Argv(child, ArgvOptions{Incoming: true}), " "); !strings.Contains(argv, ",mac=52:54:00:aa:bb:cc,") {
		t.Errorf("child argv %q: want its NIC configured with its own MAC", argv)
	}
	if len(pv) < 10 {
		t.Errorf("only %d guest-visible words found: %q", len(pv), pv)
	}
}

// TestArgvBridgeChildMatchesParent: on a bridge, too, a child differs from its
// source only in backends; and a tap machine's NIC differs from a user-network
// one's only in its backend, never in the device's guest-visible properties.
func TestArgvBridgeChildMatchesParent(t *testing.T) {
	parent := testMachine()
	parent.Spec.Ports, parent.Spec.Network = nil, vmfork.Network{Kind: vmfork.NetworkBridge, Name: "br0"}
	child := testMachine()
	child.Name, child.Spec = "web-1", parent.Spec
	child.Paths.QMP, child.Paths.RAM, child.Paths.RAMShared = "/x/web-1/qmp.sock", "/dev/shm/vmfork/t.ram", false
	pv, cv := GuestVisible(Argv(parent, ArgvOptions{})), GuestVisible(Argv(child, ArgvOptions{Incoming: true}))
	if strings.Join(pv, "\n") != strings.Join(cv, "\n") {
		t.Errorf("guest-visible configuration differs:\nparent: %q\nchild:  %q", pv, cv)
	}
	user := GuestVisible(Argv(testMachine(), ArgvOptions{}))
	if strings.Join(pv, "\n") != strings.Join(user, "\n") {
		t.Errorf("a bridge machine's devices differ from a user-network machine's:\nbridge: %q\nuser:   %q", pv, user)
	}
	argv := strings.Join(Argv(parent, ArgvOptions{}), " ")
	if !strings.Contains(argv, "-netdev tap,id=net0,fd=3 ") || strings.Contains(argv, "hostfwd") {
		t.Errorf("bridge argv %q: want the tap passed as fd 3 and no port forwards", argv)
	}
}
