package egress

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork/contract"
)

func TestNWFilterXML(t *testing.T) {
	opts := NWFilterOptions{DNS: []netip.Addr{netip.MustParseAddr("192.168.122.1")}}
	for _, tc := range []struct{ golden, spec string }{
		{"nwfilter_allow.xml", allowSpec},
		{"nwfilter_none.xml", "network: {egress: none, dns: none}"},
		{"nwfilter_all.xml", "network: {egress: all}"},
	} {
		got, err := NWFilterXML("vmfork-web-1", compileSpec(t, tc.spec), opts)
		if err != nil {
			t.Fatal(err)
		}
		golden(t, tc.golden, got)
		// libvirt's own schema, as libvirtxml models it, reads it back.
		var f libvirtxml.NWFilter
		if err := f.Unmarshal(got); err != nil {
			t.Fatalf("%s: %v", tc.golden, err)
		}
		if f.Name != "vmfork-web-1" || len(f.Entries) == 0 {
			t.Errorf("%s: read back name %q with %d rules", tc.golden, f.Name, len(f.Entries))
		}
		last := f.Entries[len(f.Entries)-1].Rule
		want := "drop"
		if strings.Contains(tc.spec, "egress: all") {
			want = "accept"
		}
		if last == nil || last.Action != want || last.Direction != "out" || last.Priority != prioDefault {
			t.Errorf("%s: last rule %+v, want the default %s out", tc.golden, last, want)
		}
	}
	if _, err := NWFilterXML("bad name", Rules{Mode: contract.EgressAll, DNS: contract.DNSHost}, opts); !errors.Is(err, contract.ErrInvalid) {
		t.Errorf("a bad filter name: %v, want ErrInvalid", err)
	}
	if _, err := NWFilterXML("ok", Rules{}, opts); err == nil {
		t.Error("zero Rules: no error")
	}
}
