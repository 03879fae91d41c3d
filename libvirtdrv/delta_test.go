//go:build cgo

package libvirtdrv

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/sharedmem"
)

// TestAllowDelta: a freeze allowed to make a delta names its files after
// the template (so removal, gc and a killed fork's repair find them) and
// keeps the write tracking in the source's own directory.
func TestAllowDelta(t *testing.T) {
	if !sharedmem.RemapSupported {
		t.Skip("no remap on this architecture: no deltas")
	}
	src := &vmfork.Machine{Paths: vmfork.Paths{Dir: "/state/machines/src"}}
	tpl := &vmfork.Template{ID: "abc", Paths: vmfork.TemplatePaths{RAM: "/mem/abc.ram"}}
	var req sharedmem.PlanRequest
	allowDelta(&req, src, tpl)
	base, pages := vmfork.DeltaPaths(tpl.Paths.RAM)
	if req.Base != base || req.Delta != pages || req.Track != filepath.Join(src.Paths.Dir, ramTrackFile) {
		t.Errorf("request %+v; want base %s, delta %s, track in %s", req, base, pages, src.Paths.Dir)
	}
	if req.Chain {
		t.Errorf("request asks for chains: the libvirt driver's deltas stand on the base alone")
	}
}

// TestCheckDeltaChild: a delta template's child that would not be remapped
// (the start hook links one file) is refused in one line naming the
// template; a full template's child, or a remapped one, is not.
func TestCheckDeltaChild(t *testing.T) {
	full := &vmfork.Template{ID: "full"}
	delta := &vmfork.Template{ID: "dlt", RAMDelta: &vmfork.RAMDelta{Base: "/mem/dlt.base.ram", Pages: "/mem/dlt.delta"}}
	if err := checkDeltaChild(full, false); err != nil {
		t.Errorf("full template without the remap: %v", err)
	}
	if err := checkDeltaChild(delta, true); err != nil {
		t.Errorf("delta template with the remap: %v", err)
	}
	err := checkDeltaChild(delta, false)
	if err == nil || !errors.Is(err, vmfork.ErrUnsupported) || !strings.Contains(err.Error(), `"dlt"`) || strings.Contains(err.Error(), "\n") {
		t.Errorf("delta template without the remap: %v; want one line naming it, unsupported", err)
	}
}
