package vmfork

import (
	"fmt"
	"regexp"
	"strings"
)

// Device is an extra QEMU device a machine was booted with (boot --device),
// such as a passed-through GPU: a device that may forbid migrating the
// machine, and so forking it, until it is unplugged (fork --detach-devices).
type Device struct {
	// Arg is QEMU's -device value, DRIVER,id=ID,PROP=VALUE,...; device_add
	// gets the same text when the device is plugged back.
	Arg string `json:"device"`
	// Detached is set on a device that is not plugged in: a fork child's
	// copy of a device that was unplugged from its source for the fork.
	Detached bool `json:"detached,omitempty"`
}

// MaxDevices bounds the extra devices of one machine.
const MaxDevices = 8

var (
	deviceDriver = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	deviceID     = regexp.MustCompile(`(?:^|,)id=([A-Za-z][A-Za-z0-9_-]*)(?:,|$)`)
)

// Driver is the device's QEMU driver, such as vfio-pci.
func (d Device) Driver() string { drv, _, _ := strings.Cut(d.Arg, ","); return drv }

// ID is the device's qdev id, which device_del takes.
func (d Device) ID() string {
	if m := deviceID.FindStringSubmatch(d.Arg); m != nil {
		return m[1]
	}
	return ""
}

// ParseDevice checks a --device value: a driver, an id (device_del needs
// one) and no property QEMU would read as a second option.
func ParseDevice(arg string) (Device, error) {
	d := Device{Arg: arg}
	if !deviceDriver.MatchString(d.Driver()) {
		return d, fmt.Errorf("device %q: want DRIVER,id=ID[,PROP=VALUE...]: %w", arg, ErrInvalid)
	}
	if d.ID() == "" {
		return d, fmt.Errorf("device %q: it needs an id (id=ID) to be unplugged for a fork: %w", arg, ErrInvalid)
	}
	for _, kv := range strings.Split(arg, ",")[1:] {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return d, fmt.Errorf("device %q: property %q is not PROP=VALUE: %w", arg, kv, ErrInvalid)
		}
	}
	return d, nil
}

// validateDevices checks the extra devices and objects of a spec: ids are
// unique and differ from the ones vmfork gives its own devices.
func (s *Spec) validateDevices() error {
	if len(s.Devices) > MaxDevices {
		return fmt.Errorf("%d devices: at most %d: %w", len(s.Devices), MaxDevices, ErrInvalid)
	}
	seen := map[string]bool{}
	for _, d := range s.Devices {
		if _, err := ParseDevice(d.Arg); err != nil {
			return err
		}
		if seen[d.ID()] || reservedDeviceIDs[d.ID()] {
			return fmt.Errorf("device %q: id %q is taken: %w", d.Arg, d.ID(), ErrInvalid)
		}
		seen[d.ID()] = true
	}
	for _, o := range s.Objects {
		typ, rest, _ := strings.Cut(o, ",")
		if !deviceDriver.MatchString(typ) || !strings.Contains(","+rest, ",id=") {
			return fmt.Errorf("object %q: want TYPE,id=ID[,PROP=VALUE...]: %w", o, ErrInvalid)
		}
	}
	return nil
}

// reservedDeviceIDs are the ids of the devices every machine has (qemudrv).
var reservedDeviceIDs = map[string]bool{"rp1": true, "rp2": true, "disk0": true, "nic0": true,
	"vser0": true, "qgaport0": true, "vmgenid0": true}

// Plugged is the devices of the spec that are plugged in.
func (s *Spec) Plugged() []Device {
	var out []Device
	for _, d := range s.Devices {
		if !d.Detached {
			out = append(out, d)
		}
	}
	return out
}

// Uses reports whether the device names object id in one of its
// properties (memdev=ID, chardev=ID, ...).
func (d Device) Uses(id string) bool {
	for _, kv := range strings.Split(d.Arg, ",")[1:] {
		if k, v, _ := strings.Cut(kv, "="); k != "id" && v == id {
			return true
		}
	}
	return false
}

// ObjectID is the id of a --object value.
func ObjectID(o string) string {
	for _, kv := range strings.Split(o, ",")[1:] {
		if k, v, _ := strings.Cut(kv, "="); k == "id" {
			return v
		}
	}
	return ""
}

// ActiveObjects is the objects that exist while the plugged devices do: an
// object only detached devices use goes with them (a RAM backend's block
// keeps its device's name after an unplug, and QEMU 7.2 asserts when
// the device is plugged back onto it, so the object is made anew).
func (s *Spec) ActiveObjects() []string {
	var out []string
	for _, o := range s.Objects {
		used, plugged := false, false
		for _, d := range s.Devices {
			if d.Uses(ObjectID(o)) {
				used, plugged = true, plugged || !d.Detached
			}
		}
		if !used || plugged {
			out = append(out, o)
		}
	}
	return out
}

// inheritDevices gives fork children their template's devices: those its
// freeze unplugged from the source are detached in the children, whose
// device configuration must match the saved device state.
func inheritDevices(tpl *Template, children []*Machine) {
	for _, c := range children {
		c.Spec.Devices = append([]Device(nil), tpl.Spec.Devices...)
	}
}
