package qemudrv

import (
	"slices"
	"testing"

	"github.com/vmfork/vmfork"
)

// TestArgvDetachedDevice: a machine's extra devices and their backends come
// after vmfork's own; a device detached for a fork is in neither a child's
// argv nor, with its backend, in the guest-visible configuration it is
// checked against.
func TestArgvDetachedDevice(t *testing.T) {
	m := testMachine()
	m.Spec.Objects = []string{"memory-backend-file,id=hm,size=1M,mem-path=/dev/shm/x,share=on", "rng-random,id=rng,filename=/dev/urandom"}
	m.Spec.Devices = []vmfork.Device{{Arg: "ivshmem-plain,memdev=hm,id=ivs0,bus=rp2"}, {Arg: "virtio-rng-pci,rng=rng,id=rng0"}}
	argv := Argv(m, ArgvOptions{})
	for _, want := range []string{m.Spec.Objects[0], m.Spec.Objects[1], m.Spec.Devices[0].Arg, m.Spec.Devices[1].Arg} {
		if !slices.Contains(argv, want) {
			t.Errorf("argv lacks %q: %q", want, argv)
		}
	}
	if i, j := slices.Index(argv, "vmgenid,id=vmgenid0,guid=auto"), slices.Index(argv, m.Spec.Devices[0].Arg); i < 0 || j < i {
		t.Errorf("extra device at %d, before vmfork's last own device at %d", j, i)
	}
	m.Spec.Devices[0].Detached = true
	argv = Argv(m, ArgvOptions{Incoming: true})
	for _, gone := range []string{m.Spec.Objects[0], m.Spec.Devices[0].Arg} {
		if slices.Contains(argv, gone) {
			t.Errorf("detached device: argv still has %q", gone)
		}
	}
	for _, kept := range []string{m.Spec.Objects[1], m.Spec.Devices[1].Arg} {
		if !slices.Contains(argv, kept) {
			t.Errorf("detached device: argv lost %q of the device still plugged", kept)
		}
	}
}
