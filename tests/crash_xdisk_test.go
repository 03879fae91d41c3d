//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qmp"
)

// Rows of the crash matrix (crash_test.go) for a file-backed extra disk: a
// fork of a victim that has a second disk (a qcow2 file, cow), killed at
// each step of the fork pipeline, and the victim's or the child's QEMU
// killed where the main rows kill one. The freeze switches both disks in
// one transaction inside the pause, and the record learns of the new tops
// only after it (journal.go:repairSourceDisk adopts the tops a cut-short
// freeze switched to). The invariant: after the repair the victim's record
// names, for both disks, the top image its QEMU writes (query-block); its
// data disk reads what it wrote before the fork and takes new writes; a
// child the repair kept reads the victim's data from before the fork. Each
// row makes its base image on its first run; every run boots its own
// victim on it. make crash-matrix runs these rows, make test does not
// (each run boots a victim; the fork points are in make test's slice
// already, on the diskless source).

const xdataDev = "/dev/vdb" // the victim's data disk in the guest

func xdiskCases() []crashCase {
	row := func(name, fault string) crashCase {
		x := &xdiskRow{}
		return crashCase{name: name, fault: fault, victim: true, matrixOnly: true, victimBoot: x.bootArgs, prep: x.prep, after: x.after}
	}
	linked := row("xdisk-fork-linked", vmfork.FaultFreezeLinked)
	linked.matrixOnly = false
	return []crashCase{
		row("xdisk-fork-reserved", vmfork.FaultForkReserved),
		row("xdisk-fork-paused", vmfork.FaultFreezePaused),
		// Between the links and the switch: QEMU holds the next tops
		// (opened before the pause) but writes the old ones. The only
		// case of its point, so make test's slice runs it too (10 s).
		linked,
		row("xdisk-fork-frozen", vmfork.FaultForkFrozen),
		row("xdisk-fork-spawned", vmfork.FaultQEMUSpawned),
		row("xdisk-fork-running", vmfork.FaultForkRunning),
		row("xdisk-fork-identity", vmfork.FaultForkIdentity),
		row("xdisk-fork-running-kill-child", vmfork.FaultForkRunning+":qemu"),
		row("xdisk-fork-paused-kill-source", vmfork.FaultFreezePaused+":qemu"),
	}
}

// xdiskRow is one row's base image and what its current run wrote.
type xdiskRow struct {
	base string
	mark string // the victim's data before the fork under the fault
}

func (x *xdiskRow) bootArgs(r *rig) []string {
	r.t.Helper()
	if x.base == "" {
		x.base = filepath.Join(r.t.TempDir(), "data.qcow2")
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", x.base, "8M").CombinedOutput(); err != nil {
			r.t.Fatalf("qemu-img create %s: %v: %s", x.base, err, out)
		}
	}
	return []string{"--disk", "id=data,file=" + x.base}
}

func (x *xdiskRow) prep(r *rig, i int) []string {
	x.mark = fmt.Sprintf("XMARK%d", i)
	x.write(r, "victim", x.mark)
	return []string{"fork", "victim", "--count", "1"}
}

// write writes s at the start of machine m's data disk and syncs it.
func (x *xdiskRow) write(r *rig, m, s string) {
	r.t.Helper()
	r.exec(m, "sh", "-c", "dd if=/dev/zero of="+xdataDev+" bs=16 count=1 conv=notrunc 2>/dev/null && printf "+s+" | dd of="+xdataDev+" conv=notrunc 2>/dev/null && sync")
}

// read reads the start of machine m's data disk, past the guest's cache.
func (x *xdiskRow) read(r *rig, m string) string {
	r.t.Helper()
	out := r.exec(m, "sh", "-c", "sync; echo 3 >/proc/sys/vm/drop_caches; dd if="+xdataDev+" bs=16 count=1 2>/dev/null | tr -d '\\000'")
	return strings.TrimSpace(out)
}

func (x *xdiskRow) after(r *rig, i int) {
	r.t.Helper()
	for _, m := range r.list() {
		if m.Parent == "victim" && m.State == "running" {
			if got := x.read(r, m.Name); got != x.mark {
				r.t.Errorf("after the repair child %s reads %q on its data disk, want the victim's %s from before the fork", m.Name, got, x.mark)
			}
		}
	}
	v := r.machine("victim")
	if v.State != "running" {
		return // its QEMU was killed: r.check has checked the rest
	}
	// The tops QEMU writes, as it says: the record must name those,
	// not the images under them (QEMU has those open too, as backing).
	boot, data := victimDisks(r)
	active := activeTops(r, v.QMP)
	for id, f := range map[string]string{"boot": boot, "data": data} {
		if !active[f] {
			r.t.Errorf("after the repair the victim's record names %s for its %s disk; its QEMU writes to %v", f, id, active)
		}
	}
	if got := x.read(r, "victim"); got != x.mark {
		r.t.Errorf("after the repair the victim reads %q on its data disk, want its %s", got, x.mark)
	}
	w := fmt.Sprintf("XW%d", i)
	x.write(r, "victim", w)
	if got := x.read(r, "victim"); got != w {
		r.t.Errorf("after the repair the victim's write reads %q, want %s", got, w)
	}
}

// victimDisks is the victim's record of its boot disk's and data disk's
// top images.
func victimDisks(r *rig) (boot, data string) {
	r.t.Helper()
	var m struct {
		Paths struct {
			Disk  string `json:"disk"`
			Disks map[string]struct {
				File string `json:"file"`
			} `json:"disks"`
		} `json:"paths"`
	}
	raw, err := os.ReadFile(filepath.Join(r.stateDir, "machines", "victim", "machine.json"))
	if err == nil {
		err = json.Unmarshal(raw, &m)
	}
	if err != nil {
		r.t.Fatalf("victim's record: %v", err)
	}
	return m.Paths.Disk, m.Paths.Disks["data"].File
}

// activeTops is the set of top images of the disks of the QEMU at QMP
// socket sock (query-block).
func activeTops(r *rig, sock string) map[string]bool {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), 30*time.Second)
	defer cancel()
	mon, err := qmp.Dial(ctx, sock)
	if err != nil {
		r.t.Fatalf("QMP %s: %v", sock, err)
	}
	defer mon.Close()
	var blocks []struct {
		Inserted *struct {
			File string `json:"file"`
		} `json:"inserted"`
	}
	if err := mon.Execute(ctx, "query-block", nil, &blocks); err != nil {
		r.t.Fatalf("query-block on %s: %v", sock, err)
	}
	out := map[string]bool{}
	for _, b := range blocks {
		if b.Inserted == nil {
			continue
		}
		f := b.Inserted.File
		// A top put on by blockdev-snapshot has no backing in its header's
		// terms: QEMU names it by its options, json:{..., "file": {...,
		// "filename": TOP}}.
		if js, ok := strings.CutPrefix(f, "json:"); ok {
			var opts struct {
				File struct {
					Filename string `json:"filename"`
				} `json:"file"`
			}
			if err := json.Unmarshal([]byte(js), &opts); err != nil || opts.File.Filename == "" {
				r.t.Fatalf("query-block on %s: top %q: %v", sock, f, err)
			}
			f = opts.File.Filename
		}
		out[f] = true
	}
	return out
}
