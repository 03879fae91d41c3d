//go:build cgo

package libvirtdrv

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

func TestFilterRef(t *testing.T) {
	iface := libvirtxml.DomainInterface{FilterRef: filterRef("vmfork-web-1")}
	got, err := iface.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, `<filterref filter="vmfork-web-1"></filterref>`) {
		t.Errorf("interface XML:\n%s\nwant a filterref naming vmfork-web-1", got)
	}
}

func TestDefineFilterNameMismatch(t *testing.T) {
	// The name check comes before any libvirt call.
	err := defineFilter(t.Context(), nil, "vmfork-a", `<filter name="vmfork-b" chain="root"></filter>`)
	if err == nil || !strings.Contains(err.Error(), `names filter "vmfork-b"`) {
		t.Errorf("got %v, want an error naming the mismatch", err)
	}
}
