package libvirtdrv

import (
	"slices"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork/qemustate"
)

// The device state of a libvirt fork is saved as the device sections alone
// (qemustate.SaveDevices) where it can be, as on the embedded driver
// (qemustate.PrepareDeviceState decides, prepareDevState in fork.go). On libvirt it
// matters more: the migration stream's end inactivates every block node of
// the source, and the cont inside virDomainResume then reopens each layer of
// the disk's chain (QEMU 7.2's bdrv_activate_all), so the pause grew by ~0.7
// ms per fork depth (docs/FLATPAUSE.md, libvirt depth); and each query-migrate
// poll of the migration is a libvirtd RPC.

// addDevicesOnlyArgs readies a child's QEMU for a device state of the device
// sections alone (qemustate.DevicesOnlyArgs), once: a child of a child inherits
// its source's command line with the source's XML. The arguments then stay
// for every descendant, whose streams of either kind carry no configuration
// section, which their own children, inheriting them too, expect.
func addDevicesOnlyArgs(d *libvirtxml.Domain) {
	// A device state without RAM blocks leaves the firmware's (pc.bios)
	// empty: QEMU copies ROMs into guest memory at reset but not when it
	// waits for an incoming load. A guest that reboots would spin on
	// zeros at the reset vector; with on_reboot=destroy (QEMU's
	// -no-reboot) the domain ends instead, its disks flushed, and the
	// machine is stopped, to be started from its disk, as on the embedded
	// driver (docs/RELIABILITY.md).
	d.OnReboot = "destroy"
	if d.QEMUCommandline == nil {
		d.QEMUCommandline = &libvirtxml.DomainQEMUCommandline{}
	}
	var have []string
	for _, a := range d.QEMUCommandline.Args {
		have = append(have, a.Value)
	}
	want := qemustate.DevicesOnlyArgs
	for i := 0; i < len(want); i++ {
		arg := []string{want[i]}
		if want[i] == "-global" && i+1 < len(want) {
			arg, i = append(arg, want[i+1]), i+1
		}
		if containsRun(have, arg) {
			continue
		}
		for _, v := range arg {
			d.QEMUCommandline.Args = append(d.QEMUCommandline.Args, libvirtxml.DomainQEMUCommandlineArg{Value: v})
		}
	}
}

// containsRun reports whether run occurs in args as consecutive elements.
func containsRun(args, run []string) bool {
	for i := 0; i+len(run) <= len(args); i++ {
		if slices.Equal(args[i:i+len(run)], run) {
			return true
		}
	}
	return false
}
