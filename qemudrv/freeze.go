package qemudrv

// How a freeze gives its template the source's RAM without copying it while
// the source is paused ("flat pause", docs/BENCHMARKS.md).
//
// A machine's QEMU always counts its RAM block as share=on, so x-ignore-shared
// keeps guest RAM out of the device state. What the block's mapping shows is
// up to vmfork (sharedmem.Remap):
//
//   - ramFirst: a booted machine maps its own RAM file share=on. In the pause
//     that file becomes the template's (a second name) and the source is
//     remapped privately onto it: nothing is copied, and the source's later
//     writes go to private pages, never to the file.
//   - ramDiff: a machine already forked, or a child, maps a frozen file
//     privately. Its RAM is that file plus the private pages it wrote since.
//     Before the pause the frozen file is copied (it does not change while
//     the guest runs); in the pause only the private pages are written into
//     the copy, which becomes the template's file, and the source is remapped
//     onto it, dropping its private pages. When no template and no other
//     process needs the old file any more, the private pages are written into
//     it in place instead, and nothing is copied at all.
//   - ramStream: a machine whose QEMU maps its RAM share=off (a child started
//     by an older vmfork) has all of its RAM in the device state.
//
// The template's file is complete at the freeze and never written again.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/sharedmem"
	"github.com/vmfork/vmfork/templates"
)

type ramMode int

const (
	ramStream ramMode = iota
	ramFirst
	ramDiff
	ramCopy // no remap on this build: the RAM file is copied in the pause
)

func (m ramMode) String() string {
	return [...]string{"stream", "first", "diff", "copy"}[m]
}

// ramPlan is what a freeze prepared for the source's RAM before the pause.
type ramPlan struct {
	mode    ramMode
	m       sharedmem.Mapping
	blockFD int    // QEMU's descriptor of the file it maps now
	own     string // the machine's own name for its RAM file
	base    *os.File
	tmp     string // the copy's temporary name; "" when written in place
	fdset   int    // QEMU's add-fd set holding the new file, or -1
	qemuFD  int
	// PrecopiedBytes were copied before the pause.
	precopied int64
}

// ownRAM is the name under which machine m keeps the RAM file its QEMU maps:
// a booted machine's own file, and for a child the same place (the store
// removes it with the machine); a child starts without one.
func ownRAM(m *vmfork.Machine) string {
	if m.Paths.RAMShared {
		return m.Paths.RAM
	}
	return filepath.Join(filepath.Dir(m.Paths.RAM), m.Name+ramSuffix)
}

const ramSuffix = ".ram"

// qomShare reports whether QEMU created its RAM block share=on.
func qomShare(ctx context.Context, mon *qmp.Monitor) (bool, error) {
	var on bool
	err := mon.Execute(ctx, "qom-get", map[string]any{"path": "/objects/" + ramID, "property": "share"}, &on)
	if err != nil {
		return false, fmt.Errorf("query RAM backend: %w", err)
	}
	return on, nil
}

// prepareRAM finds how src's RAM is mapped and prepares, before the pause,
// everything the template's RAM file needs but the private pages.
func prepareRAM(ctx context.Context, mon *qmp.Monitor, src *vmfork.Machine, t *vmfork.Template, log *logrus.Entry) (p *ramPlan, err error) {
	p = &ramPlan{fdset: -1, own: ownRAM(src)}
	shared, err := qomShare(ctx, mon)
	if err != nil || !shared {
		return p, err
	}
	size := int64(src.Spec.MemoryMiB) << 20
	if p.m, err = sharedmem.FindRAM(src.PID, size, ramSuffix, 0); err != nil {
		return nil, err
	}
	if terr := sharedmem.CanRemap(src.PID); terr != nil {
		if !p.m.Shared {
			// Remapped by a process that could trace it; this one cannot.
			return nil, fmt.Errorf("machine %q: its RAM needs a remap: %w", src.Name, terr)
		}
		// A machine on its own file can still be frozen the old way.
		log.WithError(terr).Warn("no RAM remap here: the freeze copies the RAM file while paused")
		p.mode = ramCopy
		return p, nil
	}
	if p.blockFD, err = sharedmem.FDOf(src.PID, p.m.Dev, p.m.Inode); err != nil {
		return nil, err
	}
	// The returns below set p to nil: clean up through a copy of it.
	plan := p
	defer func() {
		if err != nil {
			plan.cleanup(ctx, mon)
		}
	}()
	var forQEMU *os.File
	if p.m.Shared {
		// The guest's memory is the file itself: it becomes the template's.
		p.mode = ramFirst
		if forQEMU, err = p.m.File(os.O_RDONLY); err != nil {
			return nil, err
		}
	} else {
		p.mode = ramDiff
		inPlace, err := sharedmem.Exclusive(p.m, p.own)
		if err != nil {
			return nil, err
		}
		if inPlace {
			p.base, err = p.m.File(os.O_RDWR)
		} else {
			p.tmp = filepath.Join(filepath.Dir(t.Paths.RAM), "."+t.ID+ramSuffix+".tmp")
			p.base, p.precopied, err = sharedmem.CopyMapped(ctx, p.m, p.tmp)
		}
		if err != nil {
			return nil, err
		}
		if forQEMU, err = os.Open("/proc/self/fd/" + strconv.Itoa(int(p.base.Fd()))); err != nil {
			return nil, fmt.Errorf("reopen RAM file: %w", err)
		}
	}
	defer forQEMU.Close()
	// QEMU gets the new file read-only: its own descriptor (dup'd over by
	// Remap) can then never write or punch a template.
	var fds struct {
		FDSet int `json:"fdset-id"`
		FD    int `json:"fd"`
	}
	if err := mon.ExecuteWithFile(ctx, "add-fd", map[string]any{}, forQEMU, &fds); err != nil {
		return nil, fmt.Errorf("pass RAM file: %w", err)
	}
	p.fdset, p.qemuFD = fds.FDSet, fds.FD
	if p.mode == ramFirst {
		// The remap unmaps every page the shared mapping maps: drop them
		// now, while the guest runs, so the pause unmaps only the few
		// touched from here to stop (the data stays in the file).
		if err := sharedmem.DropShared(p.m, dropChunk); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// dropChunk bounds each stop of QEMU's main thread while the pages of a
// shared RAM mapping are dropped before the pause (about 30 ms per 128 MiB
// resident on the reference host).
const dropChunk = 128 << 20

// inPause gives t its RAM file while the source is paused, after the device
// state was saved. It returns the bytes copied in the pause.
func (p *ramPlan) inPause(ctx context.Context, src *vmfork.Machine, t *vmfork.Template) (int64, error) {
	switch p.mode {
	case ramStream:
		// The device state carried all of RAM; children need a file of the
		// right size to map.
		return sharedmem.SaveRAM(ctx, src.Paths.RAM, t.Paths.RAM, false, int64(src.Spec.MemoryMiB)<<20)
	case ramCopy:
		return sharedmem.SaveRAM(ctx, src.Paths.RAM, t.Paths.RAM, true, int64(src.Spec.MemoryMiB)<<20)
	case ramDiff:
		st, err := sharedmem.CopyPrivate(ctx, p.m, p.base)
		if err != nil {
			return 0, err
		}
		if err := sharedmem.Remap(p.m, p.qemuFD, p.blockFD); err != nil {
			return st.CopiedBytes, err
		}
		if p.tmp != "" {
			// The copy is now what the source maps: it takes the
			// machine's own name (the old file lives on while a
			// template or child still has it).
			if err := os.Rename(p.tmp, p.own); err != nil {
				return st.CopiedBytes, fmt.Errorf("name RAM file: %w", err)
			}
			p.tmp = ""
		}
		return st.CopiedBytes, link(p.own, t.Paths.RAM)
	default: // ramFirst
		if err := sharedmem.Remap(p.m, p.qemuFD, p.blockFD); err != nil {
			return 0, err
		}
		return 0, link(p.own, t.Paths.RAM)
	}
}

// link gives the source's RAM file its template name, read-only as a
// reminder (QEMU 7.2 children still get the file through vmfork, read-only).
func link(own, tpl string) error {
	if err := os.Link(own, tpl); err != nil {
		return fmt.Errorf("name template RAM file: %w", err)
	}
	return os.Chmod(tpl, 0o400)
}

// cleanup releases what prepareRAM made and the freeze no longer needs: the
// descriptor QEMU got (Remap made its own copy), and a copy that never became
// the source's RAM.
func (p *ramPlan) cleanup(ctx context.Context, mon *qmp.Monitor) {
	if p.fdset >= 0 {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		mon.Execute(cctx, "remove-fd", map[string]any{"fdset-id": p.fdset}, nil)
		cancel()
		p.fdset = -1
	}
	if p.base != nil {
		p.base.Close()
		p.base = nil
	}
	if p.tmp != "" {
		os.Remove(p.tmp)
		p.tmp = ""
	}
}

// Freeze implements vmfork.Forker. Everything that can be prepared or checked
// is done before the source is paused; the pause covers only stop, the disk
// switch, the device-state save, the source's private pages (none on its
// first fork), the remap and cont.
func (d *Driver) Freeze(ctx context.Context, src *vmfork.Machine, t *vmfork.Template) (fr vmfork.FreezeResult, err error) {
	if err := d.checkFreeze(src); err != nil {
		return fr, err
	}
	log := d.log.WithField("machine", src.Name)
	mon, err := qmp.Dial(ctx, src.Paths.QMP, qmp.WithLogger(log))
	if err != nil {
		return fr, fmt.Errorf("connect to QMP: %w", err)
	}
	defer mon.Close()
	replug, err := d.detachDevices(ctx, mon, src, t)
	if err != nil {
		return fr, err
	}
	defer replug(ctx) // runs after the source resumed (deferred before the pause)
	prep, err := d.prepareFreeze(ctx, mon, src, t)
	if err != nil {
		return fr, err
	}
	defer prep.cleanup()
	ram, err := prepareRAM(ctx, mon, src, t, log)
	if err != nil {
		return fr, fmt.Errorf("prepare RAM: %w", err)
	}
	defer ram.cleanup(ctx, mon)
	release, err := qmp.CreateSaveFile(ctx, mon, devStateFD, t.Paths.DevState)
	if err != nil {
		return fr, err
	}
	defer release()

	w, err := sharedmem.Pause(ctx, sharedmem.PauseSource{Pause: mon.Stop, Resume: mon.Cont, StillPaused: vmfork.ErrStillPaused})
	if err != nil {
		return fr, err
	}
	defer w.Rollback(ctx, &err)
	phases := newPhases()
	if err := d.inject(injectAfterStop); err != nil {
		return fr, err
	}
	if src.Spec.Disk != "" {
		if err := switchDisk(ctx, mon, src, t, prep, w); err != nil {
			return fr, fmt.Errorf("switch disk: %w", err)
		}
	}
	phases.mark("disk_ms")
	if err := qmp.SaveDeviceState(ctx, mon, devStateFD, migrationPoll, qmp.WithLogger(log)); err != nil {
		return fr, fmt.Errorf("save device state: %w", err)
	}
	phases.mark("devstate_ms")
	vmfork.Fault(vmfork.FaultFreezePaused, src.PID)
	if err := d.inject(injectBeforeRAM); err != nil {
		return fr, err
	}
	fr.RAMCopiedBytes, err = ram.inPause(ctx, src, t)
	if err != nil {
		os.Remove(t.Paths.RAM)
		return fr, fmt.Errorf("freeze RAM (%v): %w", ram.mode, err)
	}
	phases.mark("ram_ms")
	if err := d.inject(injectAfterRAM); err != nil {
		os.Remove(t.Paths.RAM)
		return fr, err
	}
	if fr.Pause, err = w.Resume(ctx); err != nil {
		return fr, err
	}
	phases.mark("cont_ms")
	if st, err := os.Stat(t.Paths.DevState); err == nil {
		t.Manifest.DevStateBytes = st.Size()
	}
	t.Manifest.RAMSharedWithChildren = ram.mode != ramStream
	log.WithFields(logrus.Fields{
		"template": t.ID, "pause": fr.Pause, "ram_mode": ram.mode.String(),
		"precopied_bytes": ram.precopied, "paused_copy_bytes": fr.RAMCopiedBytes,
	}).WithFields(phases.fields).Debug("frozen")
	return fr, nil
}

func (d *Driver) checkFreeze(src *vmfork.Machine) error {
	if !templates.Alive(src.PID, src.Paths.QMP) {
		return fmt.Errorf("machine %q: %w", src.Name, vmfork.ErrNotRunning)
	}
	return nil
}

// Fault-injection points of a freeze, for tests (VMFORK_TEST_FREEZE_FAIL).
const (
	injectAfterStop = "after-stop"
	injectBeforeRAM = "before-ram"
	injectAfterRAM  = "after-ram" // the source is remapped, cont not sent
)

// errInjected is the failure a test asked for.
var errInjected = errors.New("injected failure")

// inject fails at point when the test environment asks for it. Integration
// tests run the real binary, so a variable in the environment is how they
// reach inside a freeze; nothing else reads it.
func (d *Driver) inject(point string) error {
	if os.Getenv("VMFORK_TEST_FREEZE_FAIL") == point {
		return fmt.Errorf("%s: %w", point, errInjected)
	}
	return nil
}

// childRAM prepares the RAM of a child m of template t: its QEMU maps a
// fresh, empty file share=on (so that its own forks are ramDiff, not
// ramStream), which mapTemplate then replaces with a private mapping of the
// template before any state is loaded. It returns the machine to build the
// argv from and that file's name. Without Remap the child maps the template
// share=off, as QEMU offers.
func childRAM(m *vmfork.Machine, t *vmfork.Template) (*vmfork.Machine, string, error) {
	if !sharedmem.RemapSupported {
		return m, "", nil
	}
	// Named after the template, so that a crash's leftover goes with it
	// (Store.RemoveTemplate).
	f, err := os.CreateTemp(filepath.Dir(t.Paths.RAM), "."+t.ID+ramSuffix+".tmp-start-*")
	if err != nil {
		return nil, "", fmt.Errorf("create start RAM file: %w", err)
	}
	f.Close()
	mm := *m
	mm.Paths.RAM, mm.Paths.RAMShared = f.Name(), true
	return &mm, f.Name(), nil
}

// mapTemplate remaps the RAM of child process pid, started on start
// (childRAM), privately onto template t's RAM file, and removes start.
func mapTemplate(ctx context.Context, mon *qmp.Monitor, pid int, start string, t *vmfork.Template, sizeBytes int64) error {
	if start == "" {
		return nil
	}
	defer os.Remove(start)
	var st syscall.Stat_t
	if err := syscall.Stat(start, &st); err != nil {
		return fmt.Errorf("map template RAM: %w", err)
	}
	m, err := sharedmem.FindRAM(pid, sizeBytes, "", st.Ino)
	if err != nil {
		return fmt.Errorf("map template RAM: %w", err)
	}
	blockFD, err := sharedmem.FDOf(pid, m.Dev, m.Inode)
	if err != nil {
		return fmt.Errorf("map template RAM: %w", err)
	}
	f, err := os.Open(t.Paths.RAM)
	if err != nil {
		return fmt.Errorf("map template RAM: %w", err)
	}
	defer f.Close()
	var fds struct {
		FDSet int `json:"fdset-id"`
		FD    int `json:"fd"`
	}
	if err := mon.ExecuteWithFile(ctx, "add-fd", map[string]any{}, f, &fds); err != nil {
		return fmt.Errorf("pass template RAM file: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		mon.Execute(cctx, "remove-fd", map[string]any{"fdset-id": fds.FDSet}, nil)
		cancel()
	}()
	if err := sharedmem.Remap(m, fds.FD, blockFD); err != nil {
		return fmt.Errorf("map template RAM: %w", err)
	}
	return nil
}

// phases times the steps of a pause for the debug log.
type phases struct {
	last   time.Time
	fields logrus.Fields
}

func newPhases() *phases { return &phases{last: time.Now(), fields: logrus.Fields{}} }

func (p *phases) mark(name string) {
	now := time.Now()
	p.fields[name] = float64(now.Sub(p.last).Microseconds()) / 1000
	p.last = now
}
