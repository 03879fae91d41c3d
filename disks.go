package vmfork

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/vmfork/vmfork/overlay"
)

// A machine has one boot disk (Spec.Disk, the first --disk) and any
// number of extra disks (Spec.Disks), each with an id and a fork policy
// that says what a fork does with it. Every disk a fork freezes is
// switched in the same pause, so the children's disks are consistent
// with each other and with RAM. The guest sees the same device layout in
// every child whatever the policies (the device state must load): only
// what is behind each device differs.

// DiskPolicy is what a fork does with a disk.
type DiskPolicy string

// Disk policies.
const (
	// DiskCow (the default): the disk is frozen with the rest of the
	// machine, and each child writes to its own overlay on that image.
	DiskCow DiskPolicy = "cow"
	// DiskShared: one read-only view of the disk is given to every child,
	// with no overlay; a disk shared at boot is read-only in the source
	// too, so that the view never changes under anyone.
	DiskShared DiskPolicy = "shared"
	// DiskFresh: each child gets an empty disk of the same size; the
	// source keeps its own disk, which is not frozen.
	DiskFresh DiskPolicy = "fresh"
	// DiskKeep: the source keeps the disk and nothing of it is copied
	// anywhere (templates, exports); children get an empty one and a
	// marker, VMFORK_DISK_<ID>=fresh, their hooks can read.
	DiskKeep DiskPolicy = "keep"
)

// BootDiskID is the boot disk's id when --disk gives none.
const BootDiskID = "disk0"

// At most 16 characters: QEMU node names, which embed the id (xfile-ID),
// have at most 31.
var diskIDPattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,15}$`)

// ParseDiskPolicy parses a policy name; "" is cow.
func ParseDiskPolicy(s string) (DiskPolicy, error) {
	switch p := DiskPolicy(s); p {
	case "":
		return DiskCow, nil
	case DiskCow, DiskShared, DiskFresh, DiskKeep:
		return p, nil
	}
	return "", fmt.Errorf("disk policy %q: want cow, shared, fresh or keep: %w", s, ErrInvalid)
}

// DiskSpec is an extra disk of a machine.
type DiskSpec struct {
	ID string `json:"id"`
	// File is the base image. It is never written: the machine writes to
	// a qcow2 overlay on it in its own directory, or, for a disk shared at
	// boot, opens it read-only.
	File string `json:"file"`
	// Fork is the disk's policy ("" is cow).
	Fork DiskPolicy `json:"fork,omitempty"`
}

// Policy returns d's policy, cow when none is set.
func (d DiskSpec) Policy() DiskPolicy {
	if d.Fork == "" {
		return DiskCow
	}
	return d.Fork
}

// DiskArg is one --disk value: a bare path (the boot disk, as before) or
// id=ID,file=PATH[,fork=POLICY].
type DiskArg struct {
	ID     string
	File   string
	Policy DiskPolicy
}

// ParseDiskArg parses a --disk value.
func ParseDiskArg(s string) (DiskArg, error) {
	if !strings.Contains(s, "=") {
		// Refused before the CLI makes the path absolute.
		return DiskArg{File: s, Policy: DiskCow}, refuseNetworkDisk("disk image", s)
	}
	var a DiskArg
	var err error
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "id":
			a.ID = v
		case "file":
			a.File = v
		case "fork":
			if a.Policy, err = ParseDiskPolicy(v); err != nil {
				return a, fmt.Errorf("disk %q: %w", s, err)
			}
		default:
			return a, fmt.Errorf("disk %q: unknown option %q (want id, file, fork): %w", s, k, ErrInvalid)
		}
	}
	if a.Policy == "" {
		a.Policy = DiskCow
	}
	if a.File == "" {
		return a, fmt.Errorf("disk %q: file= is required: %w", s, ErrInvalid)
	}
	return a, refuseNetworkDisk("disk "+orBootID(a.ID), a.File)
}

// SetDisks fills s's boot disk and extra disks from --disk values: the
// first is the boot disk, which forks cow; the others are extra disks.
func (s *Spec) SetDisks(args []DiskArg) error {
	for i, a := range args {
		if i == 0 {
			if a.Policy != DiskCow {
				return fmt.Errorf("disk %q is the boot disk, which forks cow, not %s: %w", orBootID(a.ID), a.Policy, ErrInvalid)
			}
			s.Disk, s.DiskID = a.File, a.ID
			continue
		}
		if a.ID == "" {
			return fmt.Errorf("disk %s: a second disk needs an id (--disk id=ID,file=PATH): %w", a.File, ErrInvalid)
		}
		d := DiskSpec{ID: a.ID, File: a.File}
		if a.Policy != DiskCow {
			d.Fork = a.Policy
		}
		s.Disks = append(s.Disks, d)
	}
	return nil
}

func orBootID(id string) string {
	if id == "" {
		return BootDiskID
	}
	return id
}

// BootDiskID returns the boot disk's id.
func (s *Spec) BootDiskID() string { return orBootID(s.DiskID) }

// validateDisks checks the extra disks: ids, files, and a boot disk
// before them.
func (s *Spec) validateDisks() error {
	if len(s.Disks) == 0 {
		if s.DiskID != "" && !diskIDPattern.MatchString(s.DiskID) {
			return fmt.Errorf("disk id %q: want a lowercase letter, then up to 15 lowercase letters, digits or _: %w", s.DiskID, ErrInvalid)
		}
		return nil
	}
	if s.Disk == "" {
		return fmt.Errorf("extra disks need a boot disk (the first --disk): %w", ErrInvalid)
	}
	seen := map[string]bool{s.BootDiskID(): true}
	if !diskIDPattern.MatchString(s.BootDiskID()) {
		return fmt.Errorf("disk id %q: want a lowercase letter, then up to 15 lowercase letters, digits or _: %w", s.BootDiskID(), ErrInvalid)
	}
	for _, d := range s.Disks {
		if !diskIDPattern.MatchString(d.ID) {
			return fmt.Errorf("disk id %q: want a lowercase letter, then up to 15 lowercase letters, digits or _: %w", d.ID, ErrInvalid)
		}
		if seen[d.ID] {
			return fmt.Errorf("disk id %q is given twice: %w", d.ID, ErrInvalid)
		}
		seen[d.ID] = true
		if _, err := ParseDiskPolicy(string(d.Fork)); err != nil {
			return fmt.Errorf("disk %q: %w", d.ID, err)
		}
		if err := checkDiskFile("disk "+d.ID, d.File); err != nil {
			return err
		}
		if err := overlay.CheckBase(d.File); err != nil {
			return fmt.Errorf("disk %q: %w: %w", d.ID, err, ErrInvalid)
		}
	}
	return nil
}

// checkImageFile checks that path is an absolute path to a regular file.
func checkImageFile(what, path string) error {
	if err := refuseNetworkDisk(what, path); err != nil {
		return err
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%s path %q must be absolute: %w", what, path, ErrInvalid)
	}
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s %q does not exist: %w", what, path, ErrInvalid)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, asInvalid(err))
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s %q is not a regular file: %w", what, path, ErrInvalid)
	}
	return nil
}

// DiskFile is where one of a machine's extra disks is now.
type DiskFile struct {
	// File is the image QEMU opens: the machine's top overlay, or the
	// read-only image of a shared disk.
	File     string `json:"file"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// Format is File's image format, "" for qcow2 (every image vmfork
	// makes); a base image shared at boot may be raw.
	Format string `json:"format,omitempty"`
	// Block: File is a block device (blockdisk.go), which QEMU opens with
	// its host_device driver. A cow disk on one is written in place until
	// the machine's first fork freezes it.
	Block bool `json:"block,omitempty"`
}

// diskTopName is the name of extra disk id's first top image in a
// machine's directory; its later tops (after forks) are diskTopName.N.
// The names never match overlay's disk*.qcow2, the boot disk's tops.
func diskTopName(id string) string { return "xdisk-" + id + ".qcow2" }

// NextDiskTop names the top image machine dir's extra disk id moves to at
// its next fork: QEMU reopens images by the names it knows, so no name it
// has seen may ever point to another file.
func NextDiskTop(dir, id string) (string, error) {
	for n := 1; n < 1<<20; n++ {
		p := filepath.Join(dir, fmt.Sprintf("xdisk-%s.%d.qcow2", id, n))
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			return p, nil
		}
	}
	return "", fmt.Errorf("no free overlay name for disk %q in %s", id, dir)
}

// RemoveOldDiskTops removes the names of m's extra disks' earlier tops,
// once no QEMU of m uses them: they are also their templates' frozen
// images, under the templates' names, which keep the data.
func RemoveOldDiskTops(m *Machine) {
	for _, d := range m.Spec.Disks {
		cur := m.Paths.Disks[d.ID].File
		old, _ := filepath.Glob(filepath.Join(m.Paths.Dir, "xdisk-"+d.ID+".*qcow2"))
		for _, p := range old {
			if p != cur {
				os.Remove(p)
			}
		}
	}
}

// PrepareDisks gives machine m, about to start, the extra disks its record
// lacks: an overlay on the base image of each, or the base image itself,
// read-only, for a disk shared at boot. Drivers call it from Start; the
// caller saves the record.
func PrepareDisks(ctx context.Context, m *Machine) error {
	for _, d := range m.Spec.Disks {
		if _, ok := m.Paths.Disks[d.ID]; ok {
			continue
		}
		if m.Paths.Disks == nil {
			m.Paths.Disks = map[string]DiskFile{}
		}
		if overlay.IsBlockDevice(d.File) {
			f, err := blockDiskFile(d)
			if err != nil {
				return err
			}
			m.Paths.Disks[d.ID] = f
			continue
		}
		if d.Policy() == DiskShared {
			f, err := overlay.Format(d.File)
			if err != nil {
				return fmt.Errorf("disk %q: %w", d.ID, err)
			}
			df := DiskFile{File: d.File, ReadOnly: true}
			if f != "qcow2" {
				df.Format = string(f)
			}
			m.Paths.Disks[d.ID] = df
			continue
		}
		top := filepath.Join(m.Paths.Dir, diskTopName(d.ID))
		if _, err := os.Stat(top); errors.Is(err, fs.ErrNotExist) {
			if err := overlay.Create(ctx, d.File, top); err != nil {
				return fmt.Errorf("disk %q: %w", d.ID, err)
			}
		}
		m.Paths.Disks[d.ID] = DiskFile{File: top}
	}
	return nil
}

// TemplateDisk is what a template holds of one extra disk of its source,
// and what its children get of it.
type TemplateDisk struct {
	ID     string     `json:"id"`
	Policy DiskPolicy `json:"fork"`
	// File is the frozen image (cow, and shared when the fork froze it)
	// or the read-only image the source shares (shared at boot); empty for
	// fresh and keep, whose children get an empty disk of Size bytes.
	File string `json:"file,omitempty"`
	// Owned: File is in the template's directory (a frozen image).
	Owned bool `json:"owned,omitempty"`
	// Foreign: File is frozen where it is, outside the template's
	// directory: an adopted machine's own image that no hard link could
	// be made to (Template.ForeignDisk says the same of the boot disk).
	Foreign bool  `json:"foreign,omitempty"`
	Size    int64 `json:"size_bytes"`
	// Format is File's format, "" for qcow2.
	Format string `json:"format,omitempty"`
}

// Frozen reports whether the freeze switches the source's disk to a new
// overlay on this disk's frozen image.
func (d TemplateDisk) Frozen() bool { return d.Owned || d.Foreign }

// templateDiskFile is the frozen image of extra disk id in template dir.
func templateDiskFile(dir, id string) string { return filepath.Join(dir, "disk-"+id+".qcow2") }

// planTemplateDisks decides what template t holds of each of src's extra
// disks, with policies overridden for this fork; a driver's Freeze
// switches the disks whose Frozen is true.
func planTemplateDisks(src *Machine, t *Template, override map[string]DiskPolicy) error {
	t.Disks = nil
	for _, d := range src.Spec.Disks {
		cur, ok := src.Paths.Disks[d.ID]
		if !ok {
			return fmt.Errorf("disk %q has no image yet (was the machine ever started?): %w", d.ID, ErrInvalid)
		}
		pol := d.Policy()
		if o, ok := override[d.ID]; ok {
			pol = o
		}
		chain, err := overlay.Chain(cur.File)
		if err != nil {
			return fmt.Errorf("disk %q: %w", d.ID, err)
		}
		td := TemplateDisk{ID: d.ID, Policy: pol, Size: chain[0].VirtualSize}
		switch {
		case (pol == DiskCow || pol == DiskShared) && cur.ReadOnly:
			// Nothing to freeze: a read-only image never changes.
			td.File, td.Format = cur.File, cur.Format
		case (pol == DiskCow || pol == DiskShared) && cur.Block:
			// A block device written in place: frozen where it is, the
			// read-only base of the source's and the children's overlays
			// from now on (blockdisk.go).
			td.File, td.Format, td.Foreign = cur.File, cur.Format, true
		case pol == DiskCow || pol == DiskShared:
			td.File, td.Owned = templateDiskFile(t.Paths.Dir, d.ID), true
		}
		t.Disks = append(t.Disks, td)
	}
	return nil
}

// CheckDiskPolicies checks fork --disk-policy overrides against source
// spec s: every id must be one of its disks, and the boot disk forks cow.
func CheckDiskPolicies(s Spec, override map[string]DiskPolicy) error {
	for id, p := range override {
		if _, err := ParseDiskPolicy(string(p)); err != nil {
			return err
		}
		if s.Disk != "" && id == s.BootDiskID() {
			if p != DiskCow {
				return fmt.Errorf("disk %q is the boot disk, which forks cow, not %s: %w", id, p, ErrInvalid)
			}
			continue
		}
		found := false
		for _, d := range s.Disks {
			found = found || d.ID == id
		}
		if !found {
			return fmt.Errorf("no disk %q (the machine's disks: %s): %w", id, strings.Join(s.diskIDs(), ", "), ErrInvalid)
		}
	}
	return nil
}

func (s Spec) diskIDs() []string {
	var ids []string
	if s.Disk != "" {
		ids = append(ids, s.BootDiskID())
	}
	for _, d := range s.Disks {
		ids = append(ids, d.ID)
	}
	if len(ids) == 0 {
		ids = []string{"none"}
	}
	return ids
}

// ParseDiskPolicies parses --disk-policy values, ID=POLICY each.
func ParseDiskPolicies(vals []string) (map[string]DiskPolicy, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	out := map[string]DiskPolicy{}
	for _, v := range vals {
		id, p, ok := strings.Cut(v, "=")
		if !ok || id == "" {
			return nil, fmt.Errorf("disk policy %q: want ID=POLICY: %w", v, ErrInvalid)
		}
		pol, err := ParseDiskPolicy(p)
		if err != nil {
			return nil, err
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("disk %q has two policies: %w", id, ErrInvalid)
		}
		out[id] = pol
	}
	return out, nil
}

// childDisks gives child c of template t its extra disks: an overlay on
// each frozen image (cow), the read-only image (shared), an empty disk
// (fresh, keep). Children that share a disk keep it shared in their own
// forks.
func childDisks(ctx context.Context, t *Template, c *Machine) error {
	if len(t.Disks) == 0 {
		return nil
	}
	c.Paths.Disks = map[string]DiskFile{}
	c.Spec.Disks = slices.Clone(c.Spec.Disks) // the source's own, else
	for _, td := range t.Disks {
		f, err := makeDisk(ctx, td, filepath.Join(c.Paths.Dir, diskTopName(td.ID)))
		if err != nil {
			return err
		}
		c.Paths.Disks[td.ID] = f
		if td.Policy == DiskShared {
			for i := range c.Spec.Disks {
				if c.Spec.Disks[i].ID == td.ID {
					c.Spec.Disks[i].Fork = DiskShared
				}
			}
		}
	}
	return nil
}

// makeDisk gives a machine made from a template its image of disk td: an
// overlay at top on the frozen image (cow), the read-only image (shared),
// or an empty disk at top (fresh, keep).
func makeDisk(ctx context.Context, td TemplateDisk, top string) (DiskFile, error) {
	var err error
	switch td.Policy {
	case DiskCow:
		err = overlay.Create(ctx, td.File, top)
	case DiskShared:
		return DiskFile{File: td.File, ReadOnly: true, Format: td.Format, Block: overlay.IsBlockDevice(td.File)}, nil
	default:
		err = overlay.CreateEmpty(ctx, td.Size, top)
	}
	if err != nil {
		return DiskFile{}, fmt.Errorf("disk %q: %w", td.ID, err)
	}
	return DiskFile{File: top}, nil
}

// inPlaceDisks gives c, machine m's record as a child of t that takes m's
// place (rewind, resume), its extra disks: new images from t by the
// policies t was made with, under new names (QEMU reopens images by
// name), except that a disk t holds no image of (fresh, keep) stays m's
// own as it is now: neither a rewind nor a resume takes it back, or
// empties it. It returns the images it made, for the caller to remove on
// error.
func inPlaceDisks(ctx context.Context, m *Machine, t *Template, c *Machine) (made []string, err error) {
	if len(t.Disks) == 0 {
		c.Paths.Disks = nil
		return nil, nil
	}
	c.Paths.Disks = map[string]DiskFile{}
	c.Spec.Disks = slices.Clone(c.Spec.Disks)
	for _, td := range t.Disks {
		if f, ok := m.Paths.Disks[td.ID]; ok && (td.Policy == DiskKeep || td.Policy == DiskFresh) {
			c.Paths.Disks[td.ID] = f
			continue
		}
		top, err := NextDiskTop(m.Paths.Dir, td.ID)
		if err != nil {
			return made, err
		}
		f, err := makeDisk(ctx, td, top)
		if err != nil {
			return made, err
		}
		if f.File == top {
			made = append(made, top)
		}
		c.Paths.Disks[td.ID] = f
	}
	return made, nil
}

// FreshDiskMarkers returns the VMFORK_DISK_<ID>=fresh lines of the disks
// a child of t gets empty because its source keeps them.
func FreshDiskMarkers(t *Template) []string {
	var out []string
	for _, td := range t.Disks {
		if td.Policy == DiskKeep || td.Policy == DiskFresh {
			out = append(out, "VMFORK_DISK_"+strings.ToUpper(td.ID)+"=fresh")
		}
	}
	return out
}

// ownedDiskFiles returns the frozen extra-disk images in t's directory.
func (t *Template) ownedDiskFiles() []string {
	var out []string
	for _, d := range t.Disks {
		if d.Owned {
			out = append(out, d.File)
		}
	}
	return out
}

// extraDiskChains returns the layers of m's writable extra disks.
func extraDiskChains(m *Machine) ([]overlay.Layer, error) {
	var out []overlay.Layer
	for _, d := range m.Spec.Disks {
		f, ok := m.Paths.Disks[d.ID]
		if !ok {
			continue
		}
		chain, err := overlay.Chain(f.File)
		if err != nil {
			return nil, fmt.Errorf("disk %q: %w", d.ID, err)
		}
		out = append(out, chain...)
	}
	return out, nil
}

// freezeStoppedDisks freezes stopped src's extra disks into t as
// freezeStopped does the boot disk: each top moves into the template and
// the source gets a new overlay on it under the old name (no QEMU knows
// the names of a stopped machine's images).
func freezeStoppedDisks(ctx context.Context, src *Machine, t *Template) error {
	for _, td := range t.Disks {
		if !td.Frozen() {
			continue
		}
		if src.Paths.Disks[td.ID].Block {
			if err := freezeStoppedBlock(ctx, src, td); err != nil {
				return err
			}
			continue
		}
		cur := src.Paths.Disks[td.ID].File
		if busy, err := overlay.InUse(cur); err != nil || busy {
			if err == nil {
				err = fmt.Errorf("disk %s is in use by a running process: %w", cur, ErrInvalid)
			}
			return err
		}
		chain, err := overlay.Chain(cur)
		if err != nil {
			return fmt.Errorf("disk %q: %w", td.ID, err)
		}
		next := cur + ".next"
		if err := overlay.CreateOn(ctx, td.File, chain[0].Format, chain[0].VirtualSize, next); err != nil {
			return fmt.Errorf("disk %q: %w", td.ID, err)
		}
		if err := os.Rename(cur, td.File); err != nil {
			os.Remove(next)
			return fmt.Errorf("freeze disk %q: %w", td.ID, err)
		}
		if err := os.Rename(next, cur); err != nil {
			if rerr := os.Rename(td.File, cur); rerr != nil {
				return fmt.Errorf("freeze disk %q: %w; and restoring %s failed: %v", td.ID, err, cur, rerr)
			}
			return fmt.Errorf("freeze disk %q: %w", td.ID, err)
		}
	}
	return nil
}

// MultiDisker is the optional driver capability to run machines with extra
// disks (Spec.Disks) and fork them by the policies it lists.
type MultiDisker interface {
	// DiskPolicies lists the policies the driver honours in a fork.
	DiskPolicies() []DiskPolicy
	// BootsDisks reports whether the driver can also start such a
	// machine from its record alone (boot, and the children of a stopped
	// source), not only fork a running one.
	BootsDisks() bool
}

// checkDiskSupport refuses, before anything changes, extra disks or a
// policy this manager's driver cannot honour.
func (mg *Manager) checkDiskSupport(s Spec, override map[string]DiskPolicy, boots bool) error {
	if len(s.Disks) == 0 {
		return nil
	}
	md, ok := mg.Driver.(MultiDisker)
	if !ok || (boots && !md.BootsDisks()) {
		return fmt.Errorf("driver %q cannot boot a machine with more than one disk (disk %q): %w", mg.Driver.Name(), s.Disks[0].ID, ErrInvalid)
	}
	honours := map[DiskPolicy]bool{}
	for _, p := range md.DiskPolicies() {
		honours[p] = true
	}
	if err := mg.checkBlockDiskSupport(s); err != nil {
		return err
	}
	for _, d := range s.Disks {
		p := d.Policy()
		if o, ok := override[d.ID]; ok {
			p = o
		}
		if !honours[p] {
			return fmt.Errorf("driver %q cannot honour policy %s of disk %q: %w", mg.Driver.Name(), p, d.ID, ErrInvalid)
		}
	}
	return nil
}

// checkForkDisks checks fork policy overrides against source m: known
// ids, a boot disk that forks cow, a disk shared at boot that stays
// shared (its guest saw a read-only device, which a writable one cannot
// replace under the saved device state), and a driver that honours them.
func (mg *Manager) checkForkDisks(m *Machine, override map[string]DiskPolicy) error {
	if err := CheckDiskPolicies(m.Spec, override); err != nil {
		return fmt.Errorf("fork %q: %w", m.Name, err)
	}
	for _, d := range m.Spec.Disks {
		if o, ok := override[d.ID]; ok && d.Policy() == DiskShared && o != DiskShared {
			return fmt.Errorf("fork %q: disk %q is shared (read-only) and stays shared in children, not %s: %w", m.Name, d.ID, o, ErrInvalid)
		}
	}
	if err := mg.checkDiskSupport(m.Spec, override, m.State != StateRunning); err != nil {
		return fmt.Errorf("fork %q: %w", m.Name, err)
	}
	return nil
}

// renderDisks says per extra disk what fork plan p does with it.
func (p *forkPlan) renderDisks(out *Plan) {
	type disk struct {
		id       string
		pol      DiskPolicy
		readOnly bool
	}
	var ds []disk
	switch p.mode {
	case forkKept, forkHibernated:
		for _, td := range p.tpl.Disks {
			ds = append(ds, disk{td.ID, td.Policy, false})
		}
	default:
		for _, d := range p.source.Spec.Disks {
			pol := d.Policy()
			if o, ok := p.req.DiskPolicies[d.ID]; ok {
				pol = o
			}
			ds = append(ds, disk{d.ID, pol, p.source.Paths.Disks[d.ID].ReadOnly})
		}
	}
	// When the disks were or are frozen together.
	frozen := "frozen in the same pause"
	switch {
	case p.mode == forkDiskOnly && p.req.CrashConsistent:
		frozen = "switched in the same transaction, unfrozen"
	case p.mode == forkDiskOnly:
		frozen = "switched in the same transaction, under the filesystem freeze"
	case p.mode == forkStopped:
		frozen = "frozen with the boot disk, the machine stopped"
	}
	if len(ds) > 0 && p.source.Spec.Disk != "" {
		out.add("disk %q (boot disk): cow, %s; each child writes to its own overlay", p.source.Spec.BootDiskID(), frozen)
	}
	for _, d := range ds {
		if s := p.blockDiskAction(d.id, d.pol); s != "" {
			out.add("%s", s)
			continue
		}
		switch {
		case d.pol == DiskCow:
			out.add("disk %q: cow, %s; each child writes to its own overlay", d.id, frozen)
		case d.pol == DiskShared && d.readOnly && p.mode != forkKept && p.mode != forkHibernated:
			out.add("disk %q: shared, read-only already; every child gets the same read-only image", d.id)
		case d.pol == DiskShared:
			out.add("disk %q: shared, %s; every child gets that image read-only", d.id, frozen)
		case d.pol == DiskFresh:
			out.add("disk %q: fresh, not frozen; each child gets an empty disk of the same size (VMFORK_DISK_%s=fresh)", d.id, strings.ToUpper(d.id))
		case d.pol == DiskKeep:
			out.add("disk %q: keep, stays the source's alone; each child gets an empty disk of the same size (VMFORK_DISK_%s=fresh)", d.id, strings.ToUpper(d.id))
		}
	}
}

// anyIn reports whether any of files is in set (by clean path).
func anyIn(files []string, set map[string]bool) bool {
	for _, f := range files {
		if set[filepath.Clean(f)] {
			return true
		}
	}
	return false
}

// DiskInfo is one disk of a machine as DiskList tells it.
type DiskInfo struct {
	ID       string     `json:"id"`
	Base     string     `json:"base"`
	Top      string     `json:"top"`
	Fork     DiskPolicy `json:"fork"`
	ReadOnly bool       `json:"read_only,omitempty"`
	Boot     bool       `json:"boot,omitempty"`
}

// DiskList returns all of m's disks, the boot disk first. A record made
// before machines had several disks (no disk_id, no disks) has the one
// boot disk, BootDiskID, forking cow: nothing in it needs rewriting.
func (m *Machine) DiskList() []DiskInfo {
	var out []DiskInfo
	if m.Spec.Disk != "" {
		out = append(out, DiskInfo{ID: m.Spec.BootDiskID(), Base: m.Spec.Disk, Top: m.Paths.Disk, Fork: DiskCow, Boot: true})
	}
	for _, d := range m.Spec.Disks {
		f := m.Paths.Disks[d.ID]
		out = append(out, DiskInfo{ID: d.ID, Base: d.File, Top: f.File, Fork: d.Policy(), ReadOnly: f.ReadOnly})
	}
	return out
}

// dropNewDisks removes the extra-disk images in-place child c has and the
// machine it replaced, old, did not (a rewind that failed).
func dropNewDisks(c, old *Machine) {
	for id, f := range c.Paths.Disks {
		if f.File != old.Paths.Disks[id].File && filepath.Dir(f.File) == filepath.Clean(c.Paths.Dir) {
			os.Remove(f.File)
		}
	}
}
