package vmfork

import (
	"fmt"
	"path/filepath"
	"slices"
)

// What a template archive (export.go, import.go) holds of extra disks.

// archDiskName is extra disk id's image in a template archive.
func archDiskName(id string) string { return "disk-" + id + ".qcow2" }

// hasDiskFile reports whether name is the archive image of one of t's
// extra disks that has an image.
func (t *Template) hasDiskFile(name string) bool {
	for _, d := range t.Disks {
		if d.File != "" && archDiskName(d.ID) == name {
			return true
		}
	}
	return false
}

// importedDisks points imported template rec's extra disks at their
// images in its directory, flattened qcow2 all; one whose image the
// archive lacks is refused.
func importedDisks(rec *Template, files map[string]bool) error {
	rec.Disks = slices.Clone(rec.Disks)
	rec.Spec.Disks = slices.Clone(rec.Spec.Disks)
	for i, d := range rec.Disks {
		if d.File == "" {
			continue
		}
		if !files[archDiskName(d.ID)] {
			return fmt.Errorf("archive has no image of disk %q: %w", d.ID, ErrInvalid)
		}
		p := filepath.Join(rec.Paths.Dir, archDiskName(d.ID))
		rec.Disks[i].File, rec.Disks[i].Owned, rec.Disks[i].Foreign, rec.Disks[i].Format = p, true, false, ""
		for j := range rec.Spec.Disks {
			if rec.Spec.Disks[j].ID == d.ID {
				rec.Spec.Disks[j].File = p
			}
		}
	}
	return nil
}
