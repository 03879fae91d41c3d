package bench

import "testing"

// A trimmed /proc/PID/smaps of a fork child (Linux 6.1,
// QEMU 7.2 under TCG): the QEMU binary, the template RAM mapping, TCG's
// code buffer and the heap.
const smapsFixture = `55d0c8a00000-55d0c8f00000 r-xp 00000000 fe:00 1234   /usr/bin/qemu-system-x86_64
Size:               5120 kB
Rss:                4000 kB
Pss:                1000 kB
Shared_Clean:       4000 kB
VmFlags: rd ex mr mw me dw sd
7f0000000000-7f0010000000 rw-p 00000000 00:19 99     /dev/shm/vmfork-bench-1/src.1.ram
Size:             262144 kB
Rss:               40000 kB
Pss:               25000 kB
Private_Dirty:     10000 kB
VmFlags: rd wr mr mw me ac sd
7f0020000000-7f0028000000 rwxp 00000000 00:00 0 
Size:             131072 kB
Rss:               30000 kB
Pss:               30000 kB
VmFlags: rd wr ex mr mw me ac sd
55d0ca000000-55d0cb000000 rw-p 00000000 00:00 0                          [heap]
Size:              16384 kB
Rss:               12000 kB
Pss:               12000 kB
VmFlags: rd wr mr mw me ac sd
`

func TestParseSmaps(t *testing.T) {
	m, err := parseSmaps([]byte(smapsFixture), "/dev/shm/vmfork-bench-1/src.1.ram", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	// The template mapping counts in full (Rss 40000 kB), the rest as PSS.
	// TCG's buffer is TCG code even when it is longer than guest RAM.
	want := Memory{GuestRAMBytes: 40000 << 10, TCGBytes: 30000 << 10, AnonBytes: 12000 << 10, FileBytes: 1000 << 10}
	if m != want {
		t.Errorf("got %+v, want %+v", m, want)
	}
	plain, err := parseSmaps([]byte(smapsFixture), "", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := plain.Total(), int64(1000+25000+30000+12000)<<10; got != want {
		t.Errorf("without a template: total %d, want %d (plain PSS)", got, want)
	}
	if _, err := parseSmaps([]byte("nothing here\n"), "", 0); err == nil {
		t.Error("no error for smaps without Pss lines")
	}
}
