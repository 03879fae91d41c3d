package vmfork

import (
	"errors"
	"fmt"
	"github.com/vmfork/vmfork/contract"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vmfork/vmfork/customize"
)

// Template is a frozen fork point: everything a child needs to continue from
// the instant its source was frozen. Its files never change after the freeze;
// they are only removed.
type Template struct {
	// ID is "<source>.<n>". The dot cannot appear in a machine name, so a
	// template's RAM file in the mem dir never clashes with a machine's.
	ID      string    `json:"id"`
	Source  string    `json:"source"`
	Driver  string    `json:"driver"`
	Accel   string    `json:"accel,omitempty"`
	Created time.Time `json:"created"`
	// Spec is the source's configuration at the freeze; children copy it, so
	// their device configuration matches the saved device state.
	Spec  Spec          `json:"spec"`
	Paths TemplatePaths `json:"paths"`
	// Disks say what the template holds of each of its source's extra
	// disks and what its children get of them, by the fork's policies
	// (disks.go).
	Disks []TemplateDisk `json:"disks,omitempty"`
	// Contract is the contract its children get unless their fork names
	// another: the source's at the freeze, or the one template save or
	// checkpoint was given (contracts.go).
	Contract *contract.Contract `json:"contract,omitempty"`
	// Family is its source's (family.go): its children join it.
	Family string `json:"family,omitempty"`
	// HasMemory is true while the template holds RAM and device state. Once
	// no child maps its RAM they are removed, and only the frozen disk stays,
	// as long as it is a layer in some machine's disk chain.
	HasMemory bool `json:"has_memory"`
	// ForeignDisk means Paths.Disk is not in the template's directory: it
	// is an adopted machine's own image, recorded where it is because no
	// hard link to it could be made there (another file system, or a
	// backing file named relative to its directory). vmfork never writes
	// or removes it; chains keep reading it where it is.
	ForeignDisk bool `json:"foreign_disk,omitempty"`
	// VMGenID is the source's vmgenid GUID at the freeze.
	VMGenID string `json:"vmgenid,omitempty"`
	// GuestFacts are what the host read in the source's guest just before
	// the freeze, for the children's identity chains; nil for a source that
	// was stopped or whose agent did not answer.
	GuestFacts *customize.Facts `json:"guest_facts,omitempty"`
	// keysStarted is how many children's SSH host keys this process
	// started before the freeze (identity.go:preFork); not kept.
	keysStarted int
	Manifest    Manifest `json:"manifest"`
	PauseMS     float64  `json:"pause_ms,omitempty"`
	// Name is set on a template kept by name (kept.go): it is never
	// collected, and children are forked from it any time later.
	Name string `json:"name,omitempty"`
	// PoolSize is how many QEMU processes a kept template keeps started
	// ahead, waiting for a fork (pool.go).
	PoolSize int `json:"pool_size,omitempty"`
	// Expires is a kept template's deadline (template save --ttl), zero for
	// none: the reaper (ttl.go) then gives the name up, and the template
	// goes once its last child has gone.
	Expires time.Time `json:"expires,omitzero"`
	// Hibernation is the sparse copy of the RAM file under the state dir
	// while a hibernated machine's instant is kept in this template
	// (hibernate.go). The RAM file in the mem dir (Paths.RAM) is then there
	// only while children of the hibernated machine map it.
	Hibernation string `json:"hibernation,omitempty"`
	// RAMDelta is set when the template's RAM is its base file plus a
	// delta (delta.go); Paths.RAM then does not exist until CompactRAM.
	RAMDelta *RAMDelta `json:"ram_delta,omitempty"`
	// SourceParent and SourceTemplate are the source's own lineage at the
	// freeze, so that vmfork tree can place this template after its source
	// machine was removed.
	SourceParent   string `json:"source_parent,omitempty"`
	SourceTemplate string `json:"source_template,omitempty"`
	// SourceGuestMAC is the MAC the source's guest had at the instant
	// (the one its own identity chain chose, if any): a child's guest
	// still has it when it wakes, and its chain replaces it.
	SourceGuestMAC string `json:"source_guest_mac,omitempty"`
}

// TemplatePaths are a template's files. Disk is empty when the source had no
// disk; RAM and DevState are empty for a disk-only fork point (a stopped
// source).
type TemplatePaths struct {
	Dir      string `json:"dir"`
	DevState string `json:"devstate,omitempty"`
	Disk     string `json:"disk,omitempty"`
	RAM      string `json:"ram_file,omitempty"`
}

// Manifest says what a template needs of the QEMU that loads it: a child
// only starts where every field matches.
type Manifest struct {
	QEMUVersion string `json:"qemu_version"`
	MachineType string `json:"machine_type"`
	CPUModel    string `json:"cpu_model"`
	MemoryMiB   int    `json:"memory_mib"`
	CPUs        int    `json:"cpus"`
	// Devices is the guest-visible part of the QEMU configuration.
	Devices []string `json:"devices"`
	// DevStateBytes is the size of the saved device state.
	DevStateBytes int64 `json:"devstate_bytes,omitempty"`
	// RAMSharedWithChildren is false when the source's RAM was private (it
	// was itself a fork child): the device state then carries all of RAM.
	RAMSharedWithChildren bool `json:"ram_shared_with_children"`
	// DevStateFormat is how the device state was saved: "" a migration
	// stream, DevStateDevices the device sections alone (qemustate.SaveDevices),
	// DevStateNoConfig a migration stream without its configuration
	// section. A child's QEMU loads the last two with qemustate.DevicesOnlyArgs.
	DevStateFormat string `json:"devstate_format,omitempty"`
}

// Device-state formats other than a migration stream (Manifest.DevStateFormat).
const (
	// DevStateDevices is a device state saved without a migration
	// (qemustate.SaveDevices).
	DevStateDevices = "devices"
	// DevStateNoConfig is a migration stream saved by a QEMU started with
	// qemustate.DevicesOnlyArgs (a child of a DevStateDevices template): it has
	// no configuration section either.
	DevStateNoConfig = "migration-noconfig"
)

// Check reports the first field of m that differs from want, naming it.
func (m Manifest) Check(want Manifest) error {
	diff := func(field, got, want string) error {
		return fmt.Errorf("template needs %s %q, this host has %q: %w", field, want, got, ErrUnsupported)
	}
	switch {
	case m.QEMUVersion != want.QEMUVersion:
		return diff("QEMU version", m.QEMUVersion, want.QEMUVersion)
	case m.MachineType != want.MachineType:
		return diff("machine type", m.MachineType, want.MachineType)
	case m.CPUModel != want.CPUModel:
		return diff("CPU model", m.CPUModel, want.CPUModel)
	case m.MemoryMiB != want.MemoryMiB:
		return diff("memory size", strconv.Itoa(m.MemoryMiB), strconv.Itoa(want.MemoryMiB))
	case m.CPUs != want.CPUs:
		return diff("CPU count", strconv.Itoa(m.CPUs), strconv.Itoa(want.CPUs))
	case strings.Join(m.Devices, "\n") != strings.Join(want.Devices, "\n"):
		return diff("device list", strings.Join(m.Devices, " "), strings.Join(want.Devices, " "))
	}
	return nil
}

var templateIDPattern = regexp.MustCompile(`^([a-z0-9][a-z0-9-]{0,62})\.([0-9]{1,9})$`)

func validateTemplateID(id string) error {
	if !templateIDPattern.MatchString(id) {
		return fmt.Errorf("template id %q is not valid: %w", id, ErrInvalid)
	}
	return nil
}

// TemplatePaths returns the files of template id.
func (s *Store) TemplatePaths(id string) TemplatePaths {
	dir := filepath.Join(s.StateDir, dirTemplates, id)
	return TemplatePaths{
		Dir:      dir,
		DevState: filepath.Join(dir, FileDevState),
		Disk:     filepath.Join(dir, fileDisk),
		RAM:      filepath.Join(s.MemDir, id+ramSuffix),
	}
}

// NewTemplate reserves the next free id "<source>.<n>" and creates the
// template's directory. The record is written by WriteTemplate.
func (s *Store) NewTemplate(source string) (*Template, error) {
	if err := ValidateName(source); err != nil {
		return nil, err
	}
	n := 1
	ts, err := s.ListTemplates()
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		if m := templateIDPattern.FindStringSubmatch(t.ID); m != nil && m[1] == source {
			if k, _ := strconv.Atoi(m[2]); k >= n {
				n = k + 1
			}
		}
	}
	for ; ; n++ {
		id := fmt.Sprintf("%s.%d", source, n)
		p := s.TemplatePaths(id)
		err := os.Mkdir(p.Dir, 0o700)
		if errors.Is(err, fs.ErrExist) {
			continue // a directory without a record: a fork in progress
		}
		if err != nil {
			return nil, fmt.Errorf("template %q: %w", id, err)
		}
		s.clearTemplateID(id)
		return &Template{ID: id, Source: source, Created: time.Now().UTC(), Paths: p}, nil
	}
}

// WriteTemplate writes t's record (its manifest) atomically, nothing else:
// saving a kept template (`vmfork template save`) is Manager.Keep.
func (s *Store) WriteTemplate(t *Template) error {
	if err := writeJSON(filepath.Join(t.Paths.Dir, fileManifest), t); err != nil {
		return fmt.Errorf("template %q: save record: %w", t.ID, err)
	}
	return nil
}

// LoadTemplate reads template id's record; ErrNotFound if there is none.
func (s *Store) LoadTemplate(id string) (*Template, error) {
	if err := validateTemplateID(id); err != nil {
		return nil, err
	}
	var t Template
	if err := readJSON(filepath.Join(s.StateDir, dirTemplates, id, fileManifest), &t); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("template %q: %w", id, ErrNotFound)
		}
		return nil, fmt.Errorf("template %q: %w", id, err)
	}
	return &t, nil
}

// ListTemplates returns every template with a record, sorted by id.
func (s *Store) ListTemplates() ([]*Template, error) {
	entries, err := os.ReadDir(filepath.Join(s.StateDir, dirTemplates))
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var ts []*Template
	for _, e := range entries {
		if !e.IsDir() || validateTemplateID(e.Name()) != nil {
			continue
		}
		if t, err := s.LoadTemplate(e.Name()); err == nil {
			ts = append(ts, t)
		}
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].ID < ts[j].ID })
	return ts, nil
}

// DropTemplateMemory removes template t's RAM file and device state and keeps
// its frozen disk.
func (s *Store) DropTemplateMemory(t *Template) error {
	for _, p := range []string{t.Paths.RAM, t.Paths.DevState} {
		if p == "" {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("template %q: %w", t.ID, err)
		}
	}
	// Its chunk map names the RAM and device state: a later push cuts the
	// disk alone again, and gc may take the memory's chunks.
	if err := os.Remove(filepath.Join(t.Paths.Dir, fileChunkMap)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("template %q: %w", t.ID, err)
	}
	if err := s.removeRAMDelta(t.ID); err != nil {
		return err
	}
	t.HasMemory, t.RAMDelta = false, nil
	return s.WriteTemplate(t)
}

// RemoveTemplate deletes template id's directory and RAM file. A foreign
// frozen disk (Template.ForeignDisk) is outside the directory and stays.
func (s *Store) RemoveTemplate(id string) error {
	if err := validateTemplateID(id); err != nil {
		return err
	}
	p := s.TemplatePaths(id)
	if err := os.Remove(p.RAM); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("template %q: remove RAM file: %w", id, err)
	}
	if err := s.removeRAMDelta(id); err != nil {
		return err
	}
	if err := os.RemoveAll(p.Dir); err != nil {
		return fmt.Errorf("template %q: %w", id, err)
	}
	// Its warm pool's directory, empty once its members and the children
	// made from them are gone.
	os.Remove(filepath.Join(s.poolRoot(), id))
	return nil
}
