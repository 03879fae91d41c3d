package vmfork

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Admission: before a command starts QEMU processes or pauses anything (a
// fork, an explore's branches, a warm pool's members, a start), it estimates
// what they will take of the host and refuses, changing nothing, when the
// host would go below a reserve. It is part of the command's plan, so a dry
// run shows the estimate and refuses the same way.
//
//   - RAM: each new QEMU is likely to make private what the earlier children
//     of the same source made (the most any of them held, measured from
//     /proc/PID/smaps_rollup while they ran and kept in usage/SOURCE.json
//     when they stop), or its whole guest RAM when no child was measured
//     yet. Files in the mem dir count as RAM when it is a tmpfs. The
//     estimate may be up to Overcommit times what the host can give: its
//     available memory less a reserve. Children share their template's RAM
//     copy-on-write, and an unmeasured child is counted at its whole guest
//     RAM, hence an overcommit above 1 by default.
//   - The mem dir: a freeze's new RAM file, or a hibernated machine's RAM
//     brought back, must fit in its free space above a reserve.
//   - Disk: the children's overlays (as large as their siblings' grew, at
//     least a MiB) and a freeze's device state must fit in the state dir's.
//   - CPU (/proc/pressure/cpu) refuses nothing: a busy host only slows the
//     children's start down (startChildren starts fewer at once).
//
// A refusal is one line naming what is short and by how much, and wraps
// ErrNoRoom (exit code 5).

// ErrNoRoom means the host lacks the memory, mem-dir space or disk a
// command would take (admission.go); nothing was changed.
var ErrNoRoom = errors.New("not enough room on this host")

// DefaultOvercommit is the overcommit ratio unless the policy says
// otherwise: 100 children of a 256 MiB guest, none measured yet (25 GiB),
// fit a 24 GiB host with 13 GiB or more available; 100 children that each
// make 512 MiB private (50 GiB) do not.
const DefaultOvercommit = 2.0

// AdmissionPolicy is how admission weighs an estimate against the host.
type AdmissionPolicy struct {
	// Overcommit: the RAM estimated for the new machines may be up to this
	// many times what the host can give; 0 means DefaultOvercommit.
	Overcommit float64
	// Off skips the check (--overcommit off); plans still show the
	// estimate.
	Off bool
}

// ParseOvercommit parses --overcommit (VMFORK_OVERCOMMIT): a ratio above 0
// and at most 100, or "off".
func ParseOvercommit(s string) (AdmissionPolicy, error) {
	if s == "" {
		return AdmissionPolicy{}, nil
	}
	if s == "off" {
		return AdmissionPolicy{Off: true}, nil
	}
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(r) || r <= 0 || r > 100 {
		return AdmissionPolicy{}, fmt.Errorf("overcommit %q: want a ratio above 0 and at most 100 (such as 1 or 2.5), or off: %w", s, ErrInvalid)
	}
	return AdmissionPolicy{Overcommit: r}, nil
}

func (p AdmissionPolicy) ratio() float64 {
	if p.Overcommit > 0 {
		return p.Overcommit
	}
	return DefaultOvercommit
}

// Admission is an admission check's estimate and what the host had. Its
// JSON form is in plans (--dry-run --json): change it only by adding.
type Admission struct {
	// Checked is false when the policy is off: the estimate is shown only.
	Checked  bool `json:"checked"`
	Machines int  `json:"machines"` // new QEMU processes
	// RAMEachBytes is what each is likely to make private, and RAMBasis
	// where that figure comes from: "measured" (earlier children of the
	// same source), "guest_ram" (none measured yet) or "boot" (they boot
	// fresh, their RAM a file of their own in the mem dir).
	RAMEachBytes int64  `json:"ram_each_bytes"`
	RAMBasis     string `json:"ram_basis"`
	// Measured is how many earlier children the figure comes from.
	Measured int `json:"measured_children,omitempty"`
	// PendingBytes is what the source's running children may still make
	// private, to reach the most any of them did: counted in RAMBytes, as
	// the host's available memory does not hold it yet.
	PendingBytes int64 `json:"pending_bytes,omitempty"`
	// RAMBytes is the whole estimate, mem-dir files on a tmpfs included;
	// the host can give (RAMAvailableBytes-RAMReserveBytes)*Overcommit.
	RAMBytes          int64   `json:"ram_bytes"`
	RAMAvailableBytes int64   `json:"ram_available_bytes"`
	RAMReserveBytes   int64   `json:"ram_reserve_bytes"`
	Overcommit        float64 `json:"overcommit"`
	MemDirBytes       int64   `json:"mem_dir_bytes"`
	MemDirFreeBytes   int64   `json:"mem_dir_free_bytes"`
	DiskBytes         int64   `json:"disk_bytes"`
	DiskFreeBytes     int64   `json:"disk_free_bytes"`
	// CPUPressure is /proc/pressure/cpu's "some avg10" (percent), or -1
	// where the kernel has none: it only slows the start down.
	CPUPressure float64 `json:"cpu_pressure_pct"`
}

// demand is what a command's new machines will take, before the host is
// looked at.
type demand struct {
	verb     string // "fork \"web\"": the error's start
	what     string // "children", "pool members", "machine"
	machines int
	each     int64 // RAM each is likely to make private
	basis    string
	note     string // where each comes from, in words
	measured int
	pending  int64 // what running siblings may still make private
	memDir   int64 // new files in the mem dir
	disk     int64 // new files in the state dir
}

// host returns the Manager's HostProbe.
func (mg *Manager) host() HostProbe {
	if mg.Host != nil {
		return mg.Host
	}
	return procHost{}
}

// admit weighs d against the host and the policy: the estimate, and an
// error wrapping ErrNoRoom when the host would go below a reserve.
func (mg *Manager) admit(d demand) (*Admission, error) {
	h := mg.host()
	a := &Admission{
		Checked: !mg.Admission.Off, Machines: d.machines, RAMEachBytes: d.each, RAMBasis: d.basis,
		Measured: d.measured, MemDirBytes: d.memDir, DiskBytes: d.disk, Overcommit: mg.Admission.ratio(),
		CPUPressure: -1,
	}
	if pct, ok := h.CPUPressure(); ok {
		a.CPUPressure = pct
	}
	a.PendingBytes = d.pending
	a.RAMBytes = int64(d.machines)*d.each + d.pending
	var short []string
	mem, merr := h.Space(mg.Store.MemDir)
	if merr == nil {
		a.MemDirFreeBytes = mem.Free
		if mem.Tmpfs {
			a.RAMBytes += d.memDir // its pages are memory
		}
		if d.memDir > 0 && d.memDir > mem.Free-dirReserve(mem.Size) {
			short = append(short, fmt.Sprintf("mem dir %s is full for this: it needs %s, has %s free above a %s reserve: %s short",
				mg.Store.MemDir, size(d.memDir), size(max(0, mem.Free-dirReserve(mem.Size))), size(dirReserve(mem.Size)),
				size(d.memDir-(mem.Free-dirReserve(mem.Size)))))
		}
	}
	if st, err := h.Space(mg.Store.StateDir); err == nil {
		a.DiskFreeBytes = st.Free
		if d.disk > st.Free-dirReserve(st.Size) {
			short = append(short, fmt.Sprintf("state dir %s is full for this: it needs %s, has %s free above a %s reserve: %s short",
				mg.Store.StateDir, size(d.disk), size(max(0, st.Free-dirReserve(st.Size))), size(dirReserve(st.Size)),
				size(d.disk-(st.Free-dirReserve(st.Size)))))
		}
	}
	if total, avail, err := h.Memory(); err == nil {
		a.RAMAvailableBytes, a.RAMReserveBytes = avail, memReserve(total)
		can := int64(float64(max(0, avail-a.RAMReserveBytes)) * a.Overcommit)
		if a.RAMBytes > can {
			need := "need"
			if d.machines == 1 {
				need = "needs"
			}
			short = append([]string{fmt.Sprintf("memory: %d %s %s about %s (%s each: %s), the host can give %s (%s available less a %s reserve, at overcommit %g): %s short",
				d.machines, d.what, need, size(a.RAMBytes), size(d.each), d.note, size(can), size(avail), size(a.RAMReserveBytes), a.Overcommit,
				size(a.RAMBytes-can))}, short...)
		}
	}
	if len(short) == 0 || !a.Checked {
		return a, nil
	}
	return a, fmt.Errorf("%s: not enough room: %s; free some, ask for fewer, or raise --overcommit (VMFORK_OVERCOMMIT): %w",
		d.verb, strings.Join(short, "; "), ErrNoRoom)
}

// memReserve is the memory admission leaves to the host: 5% of it, at
// least 256 MiB.
func memReserve(total int64) int64 { return max(256<<20, total/20) }

// dirReserve is the space admission leaves free on a file system of size
// bytes: 5% of it, from nearlyFull to 1 GiB.
func dirReserve(size int64) int64 { return min(max(nearlyFull, size/20), 1<<30) }

// describe says what a says, for a plan's actions.
func (a *Admission) describe() string {
	verdict := "the host has room"
	if !a.Checked {
		verdict = "not checked (--overcommit off)"
	}
	s := fmt.Sprintf("take about %s of RAM for %d new QEMU processes (%s each, %s), %s in the mem dir and %s of disk; %s (%s available, overcommit %g)",
		size(a.RAMBytes), a.Machines, size(a.RAMEachBytes), basisWords(a), size(a.MemDirBytes), size(a.DiskBytes), verdict,
		size(a.RAMAvailableBytes), a.Overcommit)
	if a.CPUPressure >= 0 {
		s += fmt.Sprintf("; CPU pressure %.0f%%%s", a.CPUPressure, paceWords(a.CPUPressure))
	}
	return s
}

func basisWords(a *Admission) string {
	switch a.RAMBasis {
	case basisMeasured:
		return "measured on " + earlier(a.Measured)
	case basisBoot:
		return "they boot fresh"
	}
	return "their guest RAM: no earlier child measured"
}

const (
	basisMeasured = "measured"
	basisGuest    = "guest_ram"
	basisBoot     = "boot"
)

// childDiskFloor is the least a child's overlay is counted at.
const childDiskFloor = 1 << 20

// freezeDisk is what a freeze writes to the state dir besides the disk
// switch: the device state, and the source's new overlay.
const freezeDisk = 16 << 20

// childDemand estimates n new QEMUs that load (live) or boot from a
// template of source src: from what earlier children of src made private,
// or their guest RAM.
func (mg *Manager) childDemand(verb, what string, src *Machine, n int, live bool) demand {
	d := demand{verb: verb, what: what, machines: n}
	guest := int64(src.Spec.MemoryMiB) << 20
	u := mg.measureChildren(src.Name)
	d.disk = int64(n) * max(childDiskFloor, u.DiskBytes)
	switch {
	case !live:
		// A child that boots owns its whole RAM, a file in the mem dir.
		d.basis, d.note, d.memDir = basisBoot, "they boot fresh, their RAM files in the mem dir", int64(n)*guest
	case u.Children > 0:
		d.each, d.basis, d.measured = u.PrivateBytes, basisMeasured, u.Children
		d.note = fmt.Sprintf("the most any of %s of %q made private", earlier(u.Children), src.Name)
		if d.pending = int64(u.live)*u.PrivateBytes - u.liveBytes; d.pending > 0 {
			d.note += fmt.Sprintf("; plus %s its %d running children may still make private", size(d.pending), u.live)
		}
	default:
		d.each, d.basis = guest, basisGuest
		d.note = fmt.Sprintf("guest RAM, no child of %q measured yet", src.Name)
	}
	return d
}

// forkDemand estimates what plan p's children and freeze will take.
func (mg *Manager) forkDemand(p *forkPlan) demand {
	d := mg.childDemand(fmt.Sprintf("fork %q", p.req.Source), "children", p.source, len(p.children), p.live())
	switch p.mode {
	case forkLive:
		d.disk += freezeDisk
		d.memDir += freezeMemDir(p.source)
	case forkDiskOnly:
		d.disk += freezeDisk // the source's new overlays; no RAM is frozen
	case forkHibernated:
		// The hibernated RAM comes back into the mem dir first.
		if p.tpl.Paths.RAM != "" {
			if _, err := os.Stat(p.tpl.Paths.RAM); err != nil {
				d.memDir += max(allocated(p.tpl.Hibernation), int64(p.tpl.Spec.MemoryMiB)<<20)
			}
		}
	}
	return d
}

// freezeMemDir is what a freeze of running machine m adds to the mem dir
// (sharedmem's modes): nothing on its first fork, where its own RAM file
// becomes the template's under a second name; once that file has a second
// name (a template holds it) or m maps a frozen file privately (a child), a
// copy of it.
func freezeMemDir(m *Machine) int64 {
	if m.Paths.RAMShared && links(m.Paths.RAM) <= 1 {
		return 0
	}
	return allocated(m.Paths.RAM)
}

// links returns how many names file path has, 0 when it cannot tell.
func links(path string) uint64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 0
}

// startDemand estimates a start of stopped machine m from its own disk
// (vmfork start): it boots, owning its whole RAM. planStart admits it last,
// before anything changes, and keeps the *Admission for its render, as
// planFork does.
func (mg *Manager) startDemand(m *Machine) demand {
	guest := int64(m.Spec.MemoryMiB) << 20
	return demand{verb: fmt.Sprintf("start %q", m.Name), what: "machine", machines: 1,
		basis: basisBoot, note: "it boots, its RAM a file in the mem dir", memDir: guest, disk: childDiskFloor}
}

// childUsage is what children of one source made: the most any of them
// held privately, and of disk.
type childUsage struct {
	PrivateBytes int64     `json:"private_bytes"`
	DiskBytes    int64     `json:"disk_bytes"`
	Children     int       `json:"children"` // how many were measured
	Updated      time.Time `json:"updated"`

	// Of the running children, measured now: how many, and what they hold.
	live      int
	liveBytes int64
}

func (u *childUsage) add(o childUsage) {
	u.PrivateBytes = max(u.PrivateBytes, o.PrivateBytes)
	u.DiskBytes = max(u.DiskBytes, o.DiskBytes)
	u.Children += o.Children
}

func (s *Store) usagePath(source string) string {
	return filepath.Join(s.StateDir, dirUsage, source+".json")
}

// measureChildren returns what source's children made: what the stopped
// ones left in usage/SOURCE.json and what the running ones hold now. It
// changes nothing.
func (mg *Manager) measureChildren(source string) childUsage {
	var u childUsage
	readJSON(mg.Store.usagePath(source), &u)
	ms, _ := mg.Store.ListMachines()
	for _, m := range ms {
		if m.Parent != source {
			continue
		}
		if n, ok := mg.host().PrivateRAM(m); ok {
			u.add(childUsage{PrivateBytes: n, DiskBytes: allocated(m.Paths.Disk), Children: 1})
			u.live++
			u.liveBytes += n
		}
	}
	return u
}

// noteUsage keeps what child m holds now in its source's usage file, so
// that admission still knows it once m is gone. Called before m stops.
func (mg *Manager) noteUsage(m *Machine) {
	if m.Parent == "" || ValidateName(m.Parent) != nil {
		return
	}
	n, ok := mg.host().PrivateRAM(m)
	if !ok {
		return
	}
	path := mg.Store.usagePath(m.Parent)
	var u childUsage
	readJSON(path, &u)
	u.add(childUsage{PrivateBytes: n, DiskBytes: allocated(m.Paths.Disk), Children: 1})
	u.Updated = time.Now().UTC()
	err := os.MkdirAll(filepath.Dir(path), 0o700)
	if err == nil {
		err = writeJSON(path, u)
	}
	if err != nil {
		mg.Log.WithField("machine", m.Name).WithError(err).Debug("could not keep the child's memory use")
	}
}

// size renders n bytes for an admission line.
func size(n int64) string {
	switch {
	case n >= 1<<30 || n <= -1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	default:
		return fmt.Sprintf("%.0f MiB", math.Ceil(float64(n)/(1<<20)))
	}
}

func earlier(n int) string {
	if n == 1 {
		return "1 earlier child"
	}
	return fmt.Sprintf("%d earlier children", n)
}
