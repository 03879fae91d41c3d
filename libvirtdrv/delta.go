//go:build cgo

package libvirtdrv

// Delta templates on the libvirt driver (issue 27; sharedmem/delta.go,
// vmfork delta.go, docs/DELTAS.md). Nothing in a delta needs libvirt's
// help, so the driver does what the embedded one does, through the same
// sharedmem calls:
//
//   - Freeze of a domain whose QEMU maps a frozen file privately (forked
//     before while a child still maps that file, or a child itself): the
//     template is that file under a second name in the mem dir (the base)
//     plus a sparse file of the domain's private pages, written in the
//     pause. The domain is not remapped; libvirt sees nothing but the
//     suspend and resume it always sees.
//   - A child of such a template starts as any child (libvirt makes QEMU a
//     fresh RAM file mapped shared, START_PAUSED, -incoming defer) and is
//     remapped privately onto the base; the delta's pages are then written
//     into its copy-on-write pages with process_vm_writev from this process,
//     by the QEMU pid libvirt records in its run dir, before the device
//     state loads and long before virDomainResume. libvirt never learns of
//     it: the write is between two processes of this host, like the remap.
//
// The start hook's way (a template linked under libvirt's RAM name, mapped
// share=off by QEMU, for hosts without the remap) cannot apply a delta:
// QEMU would run on the base alone. Such a child is refused in one line.

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/sharedmem"
)

// ramTrackFile keeps the state of a machine's write tracking
// (sharedmem/track.go) in its own directory, as on the embedded driver: it
// goes with the machine.
const ramTrackFile = "ram-track.json"

// allowDelta lets the RAM plan of src's freeze into t make a delta where it
// would copy the frozen file src maps. The names derive from t's id
// (vmfork.DeltaPaths), so that removal, gc and a killed fork's repair find
// them without a record.
func allowDelta(req *sharedmem.PlanRequest, src *vmfork.Machine, t *vmfork.Template) {
	if !sharedmem.RemapSupported {
		return // no child here could apply it
	}
	req.Base, req.Delta = vmfork.DeltaPaths(t.Paths.RAM)
	req.Track = filepath.Join(src.Paths.Dir, ramTrackFile)
	// req.Chain stays unset: each delta holds all the private pages (the
	// quarter-of-the-base rule), brought up to date before the pause
	// (sharedmem precopy), so a libvirt template never depends on an
	// older one's files. A child applies RAMDelta.Files() all the same.
}

// recordDelta records in t where its RAM is after a delta freeze.
func recordDelta(t *vmfork.Template, ram *sharedmem.Plan, log *logrus.Entry) {
	if ram.Mode != sharedmem.Delta {
		return
	}
	base, pages := vmfork.DeltaPaths(t.Paths.RAM)
	held, _ := overlay.AllocatedBytes(pages)
	t.RAMDelta = &vmfork.RAMDelta{Base: base, Pages: pages, BaseOf: ram.DeltaBase, Bytes: held, Chain: ram.Chain()}
	if ram.TrackErr != nil {
		log.WithError(ram.TrackErr).Debug("no write tracking: the next delta writes all private pages in the pause")
	}
}

// checkDeltaChild refuses a child of delta template t that would not be
// remapped (remap false): the start hook links one file, and the delta's
// pages would be lost.
func checkDeltaChild(t *vmfork.Template, remap bool) error {
	if t.RAMDelta != nil && !remap {
		return fmt.Errorf("template %q: its RAM is a delta, which a libvirt child can only get through the remap this build lacks: %w", t.ID, vmfork.ErrUnsupported)
	}
	return nil
}

// mapTemplateRAM remaps child QEMU pid (started on libvirt's fresh file
// start) privately onto t's RAM: its file, or the base of a delta template
// with its deltas' pages written over it, oldest first (one delta while the
// driver asks for no chains; a chain, were one recorded, applied whole).
func mapTemplateRAM(ctx context.Context, mon monitor, pid int, start string, t *vmfork.Template) error {
	size := int64(t.Manifest.MemoryMiB) << 20
	d := t.RAMDelta
	if d == nil {
		return sharedmem.MapTemplate(ctx, mon, pid, start, t.Paths.RAM, size)
	}
	st, err := sharedmem.MapTemplateChain(ctx, mon, pid, start, d.Base, d.Files(), size)
	if err != nil {
		return fmt.Errorf("template %q: %w", t.ID, err)
	}
	f := logrus.Fields(st.LogFields())
	f["template"], f["delta_depth"] = t.ID, d.Depth()
	mon.log.WithFields(f).Debug("delta applied")
	return nil
}
