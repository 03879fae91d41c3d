//go:build integration

package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vmfork/vmfork"
)

// Rows of the crash matrix (crash_test.go) for a block-device extra disk
// (docs/ARCHITECTURE.md "Block-device disks"): a fork of a victim whose
// data disk is a loop device, killed at the points around the freeze, and
// `disk commit` killed between writing the device and moving the record,
// and between moving the record and removing the overlay. Each row makes
// one loop device on its first run and removes it when its runs are over
// (and at the test's end, on every path); every run boots its own victim
// on it. The invariant: the device is never written after the freeze
// unless a commit completed, and a commit cut short completes when run
// again. make crash-matrix runs these rows, make test does not (each run
// boots a victim; the fork rows' points are in make test's slice already).

const blockDataDev = "/dev/vdb" // the victim's data disk in the guest

func blockDiskCases() []crashCase {
	fork := func(*rig, int) []string { return []string{"fork", "victim", "--count", "1"} }
	row := func(name, fault string, prep func(*blockRow) func(*rig, int) []string, after func(*blockRow) func(*rig, int)) crashCase {
		b := &blockRow{}
		return crashCase{name: name, fault: fault, victim: true, matrixOnly: true, victimBoot: b.bootArgs,
			prep: prep(b), after: after(b), done: b.release}
	}
	forkPrep := func(b *blockRow) func(*rig, int) []string {
		return func(r *rig, i int) []string {
			b.mark = fmt.Sprintf("MARK%d", i)
			b.write(r, "victim", b.mark)
			return fork(r, i)
		}
	}
	commitPrep := func(b *blockRow) func(*rig, int) []string { return b.commitPrep }
	forkAfter := func(b *blockRow) func(*rig, int) { return b.forkRepaired }
	commitAfter := func(b *blockRow) func(*rig, int) { return b.commitRepaired }
	return []crashCase{
		row("block-fork-reserved", vmfork.FaultForkReserved, forkPrep, forkAfter),
		row("block-fork-paused", vmfork.FaultFreezePaused, forkPrep, forkAfter),
		row("block-fork-frozen", vmfork.FaultForkFrozen, forkPrep, forkAfter),
		row("block-fork-paused-kill-source", vmfork.FaultFreezePaused+":qemu", forkPrep, forkAfter),
		row("disk-committed", vmfork.FaultDiskCommitted, commitPrep, commitAfter),
		row("disk-recorded", vmfork.FaultDiskRecorded, commitPrep, commitAfter),
	}
}

// blockRow is one row's loop device and what its current run wrote.
type blockRow struct {
	dev    string
	remove func()
	mark   string // the victim's data before the command under the fault
}

func (b *blockRow) bootArgs(r *rig) []string {
	if b.dev == "" {
		b.dev, b.remove = loopDevice(r.t, 8<<20)
	}
	return []string{"--disk", "id=data,file=" + b.dev}
}

func (b *blockRow) release() {
	if b.remove != nil {
		b.remove()
		b.dev, b.remove = "", nil
	}
}

// write writes s at the start of machine m's data disk and syncs it.
func (b *blockRow) write(r *rig, m, s string) {
	r.t.Helper()
	r.exec(m, "sh", "-c", "dd if=/dev/zero of="+blockDataDev+" bs=16 count=1 conv=notrunc 2>/dev/null && printf "+s+" | dd of="+blockDataDev+" conv=notrunc 2>/dev/null && sync")
}

// read reads the start of machine m's data disk, past the guest's cache.
func (b *blockRow) read(r *rig, m string) string {
	r.t.Helper()
	out := r.exec(m, "sh", "-c", "sync; echo 3 >/proc/sys/vm/drop_caches; dd if="+blockDataDev+" bs=16 count=1 2>/dev/null | tr -d '\\000'")
	return strings.TrimSpace(out)
}

// dataDisk is the victim's record of its data disk.
func (b *blockRow) dataDisk(r *rig) (file string, block bool) {
	r.t.Helper()
	var m struct {
		Paths struct {
			Disks map[string]struct {
				File  string `json:"file"`
				Block bool   `json:"block"`
			} `json:"disks"`
		} `json:"paths"`
	}
	data, err := os.ReadFile(filepath.Join(r.stateDir, "machines", "victim", "machine.json"))
	if err == nil {
		err = json.Unmarshal(data, &m)
	}
	if err != nil {
		r.t.Fatalf("victim's record: %v", err)
	}
	d := m.Paths.Disks["data"]
	return d.File, d.Block
}

// frozenBy lists the templates that hold the device as a frozen base.
func (b *blockRow) frozenBy(r *rig) []string {
	r.t.Helper()
	files, _ := filepath.Glob(filepath.Join(r.stateDir, "templates", "*", "*.json"))
	var out []string
	for _, f := range files {
		var t struct {
			ID    string `json:"id"`
			Disks []struct {
				File string `json:"file"`
			} `json:"disks"`
		}
		data, err := os.ReadFile(f)
		if err != nil || json.Unmarshal(data, &t) != nil {
			continue
		}
		for _, d := range t.Disks {
			if d.File == b.dev {
				out = append(out, filepath.Base(filepath.Dir(f)))
			}
		}
	}
	return out
}

// chainBase is the last image of top's backing chain.
func chainBase(r *rig, top string) string {
	r.t.Helper()
	out, err := exec.Command("qemu-img", "info", "-U", "--backing-chain", "--output=json", top).Output()
	if err != nil {
		r.t.Fatalf("qemu-img info %s: %v", top, err)
	}
	var chain []struct {
		Filename string `json:"filename"`
	}
	if err := json.Unmarshal(out, &chain); err != nil || len(chain) == 0 {
		r.t.Fatalf("qemu-img info %s: %v: %s", top, err, out)
	}
	return chain[len(chain)-1].Filename
}

// forkRepaired: after a fork of the victim killed around its freeze and
// the repair, the victim either still writes to the device in place, and
// then nothing holds the device frozen, or writes to an overlay on it, and
// then its writes leave the device as it is. A child the repair kept reads
// the victim's data from before the fork.
func (b *blockRow) forkRepaired(r *rig, i int) {
	r.t.Helper()
	file, inPlace := b.dataDisk(r)
	frozen := b.frozenBy(r)
	switch {
	case inPlace && file != b.dev:
		r.t.Fatalf("after the repair the victim's data disk is block device %s, want %s", file, b.dev)
	case inPlace && len(frozen) > 0:
		r.t.Fatalf("after the repair the victim writes in place on %s, which templates %v hold frozen", b.dev, frozen)
	case !inPlace:
		if base := chainBase(r, file); base != b.dev {
			r.t.Fatalf("after the repair the victim's data disk %s is on %s, want on the device %s", file, base, b.dev)
		}
	}
	for _, m := range r.list() {
		if m.Parent == "victim" && m.State == "running" {
			if got := b.read(r, m.Name); got != b.mark {
				r.t.Errorf("after the repair child %s reads %q on its data disk, want the victim's %s from before the fork", m.Name, got, b.mark)
			}
		}
	}
	if v := r.machine("victim"); v.State != "running" {
		return // its QEMU was killed (the record's checks above suffice)
	}
	if got := b.read(r, "victim"); got != b.mark {
		r.t.Errorf("after the repair the victim reads %q on its data disk, want its %s", got, b.mark)
	}
	before := deviceSum(r.t, b.dev)
	w := fmt.Sprintf("W%d", i)
	b.write(r, "victim", w)
	if got := b.read(r, "victim"); got != w {
		r.t.Errorf("after the repair the victim's write reads %q, want %s", got, w)
	}
	if inPlace {
		if got := deviceHead(r.t, b.dev, 16); got != w {
			r.t.Errorf("the victim writes in place, but the device reads %q, want %s", got, w)
		}
	} else if deviceSum(r.t, b.dev) != before {
		r.t.Errorf("the victim writes to an overlay on %s, but the device changed under its write", b.dev)
	}
}

// commitPrep gives the victim an overlay on its device that holds a write
// the device lacks (a template save freezes the device; the template goes
// again), stops it, and commits under the fault.
func (b *blockRow) commitPrep(r *rig, i int) []string {
	r.t.Helper()
	b.write(r, "victim", fmt.Sprintf("A%d", i))
	r.ok("template", "save", "victim", fmt.Sprintf("kc%d", i))
	b.mark = fmt.Sprintf("B%d", i)
	b.write(r, "victim", b.mark)
	r.ok("stop", "victim")
	r.ok("template", "rm", fmt.Sprintf("kc%d", i))
	if got := deviceHead(r.t, b.dev, 16); got != fmt.Sprintf("A%d", i) {
		r.t.Fatalf("before the commit the device reads %q, want A%d frozen", got, i)
	}
	return []string{"disk", "commit", "victim"}
}

// commitRepaired: a commit cut short leaves the victim on its overlay or
// on the device, either way whole; run again, it completes: the device
// holds the victim's last write, the record names the device and no
// overlay of the disk is left.
func (b *blockRow) commitRepaired(r *rig, _ int) {
	r.t.Helper()
	if file, inPlace := b.dataDisk(r); !inPlace {
		if base := chainBase(r, file); base != b.dev {
			r.t.Fatalf("after a cut commit the victim's data disk %s is on %s, want on the device %s", file, base, b.dev)
		}
	}
	r.ok("disk", "commit", "victim")
	if got := deviceHead(r.t, b.dev, 16); got != b.mark {
		r.t.Errorf("after the commit ran again the device reads %q, want the victim's %s", got, b.mark)
	}
	if file, inPlace := b.dataDisk(r); !inPlace || file != b.dev {
		r.t.Errorf("after the commit ran again the victim's data disk is %s (block %v), want the device %s in place", file, inPlace, b.dev)
	}
	if left, _ := filepath.Glob(filepath.Join(r.stateDir, "machines", "victim", "xdisk-*")); len(left) > 0 {
		r.t.Errorf("after the commit ran again overlays are left: %v", left)
	}
	if tpls := b.frozenBy(r); len(tpls) > 0 {
		r.t.Errorf("after the commit templates still hold %s: %v", b.dev, tpls)
	}
}
