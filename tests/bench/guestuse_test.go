package bench

import (
	"errors"
	"slices"
	"testing"

	"github.com/vmfork/vmfork"
)

func TestParseGuestUse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want GuestUse
		str  string
	}{
		{"0", GuestUse{}, "0"},
		{"", GuestUse{}, "0"},
		{"75%", GuestUse{Percent: 75}, "75%"},
		{" 12.5% ", GuestUse{Percent: 12.5}, "12.5%"},
		{"1536M", GuestUse{MiB: 1536}, "1536M"},
		{"1G", GuestUse{MiB: 1024}, "1G"},
	} {
		got, err := ParseGuestUse(tc.in)
		if err != nil || got != tc.want || got.String() != tc.str {
			t.Errorf("ParseGuestUse(%q) = %+v (%q), %v; want %+v (%q)", tc.in, got, got.String(), err, tc.want, tc.str)
		}
	}
	for _, bad := range []string{"100%", "-5%", "abc%", "lots", "-1M", "0M"} {
		if _, err := ParseGuestUse(bad); !errors.Is(err, vmfork.ErrInvalid) {
			t.Errorf("ParseGuestUse(%q): err %v, want ErrInvalid", bad, err)
		}
	}
}

func TestGuestUseMiBFor(t *testing.T) {
	for _, tc := range []struct {
		use  GuestUse
		mem  int
		want int
		ok   bool
	}{
		{GuestUse{}, 512, 0, true},
		{GuestUse{Percent: 75}, 2048, 1536, true},
		{GuestUse{Percent: 33}, 512, 168, true}, // whole MiB, rounded down
		{GuestUse{MiB: 1536}, 2048, 1536, true},
		{GuestUse{MiB: 512}, 512, 0, false}, // the whole RAM: the guest would run out
		{GuestUse{MiB: 1536}, 512, 0, false},
	} {
		got, err := tc.use.MiBFor(tc.mem)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%+v.MiBFor(%d) = %d, %v; want %d (ok %v)", tc.use, tc.mem, got, err, tc.want, tc.ok)
		}
	}
}

func TestParseGuestMeminfo(t *testing.T) {
	data := []byte("MemTotal:        2035952 kB\nMemFree:          250000 kB\nMemAvailable:     300000 kB\nBuffers: 0 kB\nShmem:           1572872 kB\n")
	m, err := parseGuestMeminfo(data)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Meminfo{TotalBytes: 2035952 << 10, FreeBytes: 250000 << 10, AvailableBytes: 300000 << 10, ShmemBytes: 1572872 << 10}); m != want {
		t.Errorf("got %+v, want %+v", m, want)
	}
	if _, err := parseGuestMeminfo([]byte("sh: cat: not found\n")); err == nil {
		t.Error("no error for output that is not meminfo")
	}
}

func TestParseMethods(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Method
	}{
		{"", nil},
		{"all", nil},
		// Rotation order, whatever the order given; the driver brings its reference.
		{"libvirt_driver,vmfork", []Method{MethodVmfork, MethodLibvirtDriver, MethodLibvirtCreate}},
		{"cold_boot, floor ,vmfork", []Method{MethodVmfork, MethodFloor, MethodCold}},
		{"libvirt_restore", []Method{MethodRestore}},
	} {
		got, err := ParseMethods(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseMethods(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"floor", "floor,cold_boot", "libvirt_create_paused", "vmfork,qemu", "vmfork,"} {
		if _, err := ParseMethods(bad); !errors.Is(err, vmfork.ErrInvalid) {
			t.Errorf("ParseMethods(%q): err %v, want ErrInvalid", bad, err)
		}
	}
}

func TestPeerMethods(t *testing.T) {
	got, err := peerMethods(nil, true)
	if err != nil || !slices.Equal(got, allMethods) {
		t.Errorf("default with libvirt = %v, %v; want all", got, err)
	}
	// Without libvirt the default quietly leaves libvirt's methods out...
	got, err = peerMethods(nil, false)
	if want := []Method{MethodVmfork, MethodFloor, MethodKept, MethodCold}; err != nil || !slices.Equal(got, want) {
		t.Errorf("default without libvirt = %v, %v; want %v", got, err, want)
	}
	// ...but asking for one without libvirt is a mistake.
	if _, err := peerMethods([]Method{MethodVmfork, MethodLibvirtDriver, MethodLibvirtCreate}, false); !errors.Is(err, vmfork.ErrInvalid) {
		t.Errorf("libvirt driver without libvirt: err %v, want ErrInvalid", err)
	}
}

func TestRamMapping(t *testing.T) {
	const size = 512 << 20
	for _, tc := range []struct{ line, want string }{
		{"7f0000000000-7f0020000000 rw-p 00000000 00:1a 123 /dev/shm/libvirt/qemu/3-vmfork-bench-1-drv512/pc.ram", "/dev/shm/libvirt/qemu/3-vmfork-bench-1-drv512/pc.ram"},
		{"7f0000000000-7f0020000000 rw-s 00000000 00:1a 123 /dev/shm/x.ram (deleted)", "/dev/shm/x.ram"},
		{"7f0000000000-7f0010000000 rw-p 00000000 00:1a 123 /dev/shm/small", ""}, // shorter than the guest's RAM
		{"7f0000000000-7f0020000000 rw-p 00000000 00:00 0 ", ""},                 // anonymous
		{"7f0000000000-7f0040000000 rwxp 00000000 00:00 0 [heap]", ""},
	} {
		if got := ramMapping(tc.line, size); got != tc.want {
			t.Errorf("ramMapping(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
}
