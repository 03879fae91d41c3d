//go:build cgo && integration

package libvirtdrv

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork/contract"
	"github.com/vmfork/vmfork/egress"
)

// TestNWFilterLibvirtd defines a machine's filter in the real libvirtd
// (scripts/libvirtd.sh starts it), finds it in the list, and removes it.
// It touches no other filter.
func TestNWFilterLibvirtd(t *testing.T) {
	d, err := New("qemu:///system", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	name := fmt.Sprintf("vmfork-test-%d", os.Getpid())
	t.Cleanup(func() {
		// t.Context() has ended by the time cleanups run.
		if err := undefineFilter(context.Background(), d.conn, name); err != nil {
			t.Error(err)
		}
	})
	dest, err := contract.ParseDest("10.0.0.0/8:443")
	if err != nil {
		t.Fatal(err)
	}
	r, err := egress.Compile(t.Context(), contract.Network{Egress: contract.Egress{Mode: contract.EgressAllow, Allow: []contract.Dest{dest}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	xml, err := egress.NWFilterXML(name, r, egress.NWFilterOptions{DNS: []netip.Addr{netip.MustParseAddr("192.168.122.1")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := defineFilter(t.Context(), d.conn, name, xml); err != nil {
		t.Fatal(err)
	}
	// Again, wider: a redefinition in place (vmfork contract NAME --set).
	wide, err := egress.NWFilterXML(name, egress.Rules{Mode: contract.EgressAll, DNS: contract.DNSHost}, egress.NWFilterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := defineFilter(t.Context(), d.conn, name, wide); err != nil {
		t.Fatalf("redefine: %v", err)
	}
	if err := defineFilter(t.Context(), d.conn, name, xml); err != nil {
		t.Fatalf("redefine: %v", err)
	}
	if names := filterNames(t, d.conn); !slices.Contains(names, name) {
		t.Fatalf("nwfilter list %v has no %s", names, name)
	}
	f, err := d.conn.LookupNWFilterByName(name)
	if err != nil {
		t.Fatal(err)
	}
	back, err := f.GetXMLDesc(0)
	f.Free()
	if err != nil {
		t.Fatal(err)
	}
	if n, m := countRules(t, back), countRules(t, xml); n != m {
		t.Errorf("libvirt holds %d rules, the XML has %d:\n%s", n, m, back)
	}
	if err := undefineFilter(t.Context(), d.conn, name); err != nil {
		t.Fatal(err)
	}
	if err := undefineFilter(t.Context(), d.conn, name); err != nil {
		t.Errorf("undefine again: %v, want nil", err)
	}
	if names := filterNames(t, d.conn); slices.Contains(names, name) {
		t.Errorf("nwfilter list %v still has %s", names, name)
	}
	if _, err := d.conn.LookupNWFilterByName(name); !errors.Is(err, libvirt.ERR_NO_NWFILTER) {
		t.Errorf("lookup after undefine: %v, want ERR_NO_NWFILTER", err)
	}
}

func filterNames(t *testing.T, conn *libvirt.Connect) []string {
	t.Helper()
	fs, err := conn.ListAllNWFilters(0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range fs {
		n, err := f.GetName()
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
		f.Free()
	}
	return names
}

func countRules(t *testing.T, xml string) int {
	t.Helper()
	var f libvirtxml.NWFilter
	if err := f.Unmarshal(xml); err != nil {
		t.Fatal(err)
	}
	return len(f.Entries)
}
