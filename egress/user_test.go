package egress

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestResolvConf(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := ResolvConf(write("a", "# comment\nsearch example.com\nnameserver 127.0.0.53\nnameserver fe80::1%eth0\nnameserver bogus\noptions edns0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Addr{netip.MustParseAddr("127.0.0.53"), netip.MustParseAddr("fe80::1")}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	got, err = ResolvConf(write("b", "search example.com\n"))
	if err != nil || len(got) != 2 || !got[0].IsLoopback() || !got[1].IsLoopback() {
		t.Errorf("no nameserver: got %v, %v, want the loopback defaults", got, err)
	}
	if _, err := ResolvConf(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing resolv.conf: no error")
	}
}
