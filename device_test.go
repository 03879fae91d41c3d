package vmfork

import (
	"errors"
	"testing"
)

func TestParseDevice(t *testing.T) {
	for _, tc := range []struct {
		arg, id, driver string
		ok              bool
	}{
		{"ivshmem-plain,memdev=hm,id=ivs0,bus=rp2", "ivs0", "ivshmem-plain", true},
		{"vfio-pci,host=0000:65:00.0,id=gpu0,bus=rp2", "gpu0", "vfio-pci", true},
		{"vfio-pci,host=0000:65:00.0", "", "vfio-pci", false}, // no id: cannot be unplugged
		{"vfio-pci,id=", "", "vfio-pci", false},
		{"Bad Driver,id=x", "x", "Bad Driver", false},
		{"vfio-pci,id=gpu0,,x", "gpu0", "vfio-pci", false}, // an empty property
		{"vfio-pci,id=gpu0,nonsense", "gpu0", "vfio-pci", false},
	} {
		d, err := ParseDevice(tc.arg)
		if (err == nil) != tc.ok {
			t.Errorf("ParseDevice(%q): got error %v, want ok %v", tc.arg, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseDevice(%q): got %v, want ErrInvalid", tc.arg, err)
		}
		if d.ID() != tc.id || d.Driver() != tc.driver {
			t.Errorf("ParseDevice(%q): got id %q driver %q, want %q %q", tc.arg, d.ID(), d.Driver(), tc.id, tc.driver)
		}
	}
}

func TestValidateDevices(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec Spec
		ok   bool
	}{
		{"one", Spec{Devices: []Device{{Arg: "ivshmem-plain,memdev=hm,id=ivs0"}}, Objects: []string{"memory-backend-file,id=hm,size=1M"}}, true},
		{"same id twice", Spec{Devices: []Device{{Arg: "a-b,id=x"}, {Arg: "c-d,id=x"}}}, false},
		{"id of vmfork's own", Spec{Devices: []Device{{Arg: "pcie-root-port,id=rp2"}}}, false},
		{"object without id", Spec{Objects: []string{"memory-backend-file,size=1M"}}, false},
	} {
		if err := tc.spec.validateDevices(); (err == nil) != tc.ok {
			t.Errorf("%s: got %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestActiveObjects: an object goes with the detached devices that use it,
// and stays while a plugged device or none uses it.
func TestActiveObjects(t *testing.T) {
	s := Spec{
		Objects: []string{"memory-backend-file,id=hm,size=1M", "memory-backend-file,id=shared,size=1M", "iothread,id=io0"},
		Devices: []Device{
			{Arg: "ivshmem-plain,memdev=hm,id=ivs0", Detached: true},
			{Arg: "ivshmem-plain,memdev=shared,id=ivs1", Detached: true},
			{Arg: "ivshmem-plain,memdev=shared,id=ivs2"},
		},
	}
	got := s.ActiveObjects()
	want := []string{"memory-backend-file,id=shared,size=1M", "iothread,id=io0"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("ActiveObjects: got %q, want %q", got, want)
	}
	if p := s.Plugged(); len(p) != 1 || p[0].ID() != "ivs2" {
		t.Errorf("Plugged: got %v, want ivs2 only", p)
	}
}
