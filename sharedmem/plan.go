package sharedmem

// How a freeze gives its template the source's RAM without copying it while
// the source is paused ("flat pause", docs/FLATPAUSE.md), for any driver:
// both reach QEMU through something that runs QMP commands and passes files
// (Monitor), and both know the QEMU process's pid.
//
// A machine's QEMU counts its RAM block as share=on, so x-ignore-shared
// keeps guest RAM out of the device state. What the block's mapping shows is
// up to vmfork (Remap):
//
//   - First: a booted machine maps its own RAM file share=on. In the pause
//     that file becomes the template's (a second name) and the source is
//     remapped privately onto it: nothing is copied, and the source's later
//     writes go to private pages, never to the file.
//   - Diff: a machine already forked, or a child, maps a frozen file
//     privately. Its RAM is that file plus the private pages it wrote since.
//     Before the pause the frozen file is copied (it does not change while
//     the guest runs); in the pause only the private pages are written into
//     the copy, which becomes the template's file, and the source is remapped
//     onto it, dropping its private pages. When no template and no other
//     process needs the old file any more, the private pages are written into
//     it in place instead, and nothing is copied at all.
//   - Delta: as Diff, when the request allows it and the old file is not
//     the source's alone: the template is the old file (the base, a second
//     name) plus a sparse file of the private pages written in the pause
//     (only those written since the last delta where writes are tracked);
//     the old file is not copied and the source is not remapped (delta.go,
//     track.go).
//   - Stream: a machine whose QEMU maps its RAM share=off has all of its RAM
//     in the device state.
//   - Copy: the RAM file is shared but cannot be remapped (no ptrace here,
//     another architecture, or a RAM file on another file system than the
//     templates'): it is copied in the pause, the old way.
//
// The template's file is complete at the freeze and never written again.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Monitor is the part of a QMP client a RAM freeze uses: qmp.Executor, over a
// socket of vmfork's own or libvirt's passthrough.
type Monitor interface {
	Execute(ctx context.Context, cmd string, args, result any) error
	ExecuteWithFile(ctx context.Context, cmd string, args any, f *os.File, result any) error
}

// Mode is how a freeze gives the template its RAM.
type Mode int

// Modes of a RAM freeze (the package comment above says what each does).
const (
	Stream Mode = iota
	First
	Diff
	Copy
	Delta
)

func (m Mode) String() string {
	return [...]string{"stream", "first", "diff", "copy", "delta"}[m]
}

// QOMShare reports whether QEMU created its memory backend id share=on.
func QOMShare(ctx context.Context, mon Monitor, id string) (bool, error) {
	var on bool
	err := mon.Execute(ctx, "qom-get", map[string]any{"path": "/objects/" + id, "property": "share"}, &on)
	if err != nil {
		return false, fmt.Errorf("query RAM backend: %w", err)
	}
	return on, nil
}

// PlanRequest says what a RAM freeze works on.
type PlanRequest struct {
	PID       int   // the source's QEMU
	SizeBytes int64 // its RAM size
	// Shared says QEMU's RAM block is share=on (QOMShare); otherwise the
	// device state carries RAM (Stream).
	Shared bool
	// RAM is the file QEMU opened, by the name vmfork knows (Copy reads it).
	RAM string
	// Own is the name under which the source keeps the file it maps from
	// now on: a copy made for Diff is renamed to it. It must be on the
	// template's file system for anything but Copy and Stream.
	Own string
	// Template is the template's RAM file, made by InPause; Temp a name
	// beside it for the copy made before the pause.
	Template, Temp string
	// Suffix ends the name of the file QEMU maps (".ram", "pc.ram").
	Suffix string
	// Delta and Base, when set, allow a delta freeze (delta.go) where Diff
	// would copy the frozen file: Base becomes a second name of that file
	// and Delta the sparse file of the private pages; Template is then not
	// made. Only for a consumer that maps the base and applies the delta.
	Delta, Base string
	// Track is the file that keeps the state of the source's write
	// tracking (track.go), in its own directory; "" for none.
	Track string
	// Chain allows a tracked delta to hold only the pages changed since
	// the last delta and name the deltas before it (chain.go; Plan.Chain):
	// only for a consumer that applies the whole chain. Without it every
	// delta holds all the source's private pages.
	Chain bool
	// Children is how many children will start from the template at
	// once: a delta is made only while the private pages, which each of
	// them will hold alone, times max(Children, maxDeltaShare) are at most
	// the base's data (a burst gets a full file they all share).
	Children int
}

// Plan is what a freeze prepared for the source's RAM before the pause.
type Plan struct {
	Mode Mode
	// CopyReason says why a shared RAM file is copied in the pause (Copy).
	CopyReason error
	// Precopied is how much was copied before the pause.
	Precopied int64
	// DeltaBase is the name the source's mapping showed for the base file
	// of a Delta freeze (for the record; the template holds Base).
	DeltaBase string
	// TrackErr says why a Delta freeze's write tracking is not to be had
	// (the freeze itself went on without it).
	TrackErr error

	req     PlanRequest
	m       Mapping
	blockFD int // QEMU's descriptor of the file it maps now
	base    *os.File
	tmp     string // the copy's name until renamed; "" when written in place
	fdset   int    // QEMU's add-fd set holding the new file, or -1
	qemuFD  int
	// A Delta freeze's files until they are whole: the delta being
	// written (named deltaTmp) and whether Base was linked.
	delta      *os.File
	deltaTmp   string
	baseLinked bool
	// Write tracking (track.go): tracked when the delta file holds the
	// last delta and the pause writes only the pages written since.
	tracked bool
	track   Track
	// A chained delta's names for the deltas before it (oldest first)
	// and the pages they hold (chain.go).
	chain     []string
	chainHeld pageSet
}

// Prepare finds how the source's RAM is mapped and prepares, while it runs,
// everything the template's RAM file needs but the private pages. It checks
// that the remap can be done (ptrace, one file system) before the pause. On
// error nothing of it is left; otherwise the caller defers Cleanup.
func Prepare(ctx context.Context, mon Monitor, req PlanRequest) (p *Plan, err error) {
	p = &Plan{req: req, fdset: -1}
	if !req.Shared {
		return p, nil
	}
	if p.m, err = FindRAM(req.PID, req.SizeBytes, req.Suffix, 0); err != nil {
		return nil, err
	}
	if why := remapBlocked(p.m, req); why != nil {
		if !p.m.Shared {
			// Remapped by a process that could trace it; this one cannot.
			return nil, fmt.Errorf("its RAM needs a remap: %w", why)
		}
		// A machine on its own file can still be frozen the old way.
		p.Mode, p.CopyReason = Copy, why
		return p, nil
	}
	if p.blockFD, err = FDOf(req.PID, p.m.Dev, p.m.Inode); err != nil {
		return nil, err
	}
	// The returns below set p to nil: clean up through a copy of it.
	plan := p
	defer func() {
		if err != nil {
			plan.Cleanup(ctx, mon)
		}
	}()
	var forQEMU *os.File
	if p.m.Shared {
		// The guest's memory is the file itself: it becomes the template's.
		p.Mode = First
		if forQEMU, err = p.m.File(os.O_RDONLY); err != nil {
			return nil, err
		}
	} else {
		p.Mode = Diff
		inPlace, err := Exclusive(p.m, req.Own)
		if err != nil {
			return nil, err
		}
		if !inPlace && req.Delta != "" {
			ok, err := p.prepareDelta(ctx)
			if err != nil {
				return nil, err
			}
			if ok {
				// QEMU gets nothing: it keeps mapping the base.
				p.Mode = Delta
				return p, nil
			}
		}
		if inPlace {
			p.base, err = p.m.Writable()
		} else {
			p.tmp = req.Temp
			p.base, p.Precopied, err = CopyMapped(ctx, p.m, p.tmp)
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
	if p.fdset, p.qemuFD, err = passFD(ctx, mon, forQEMU); err != nil {
		return nil, fmt.Errorf("pass RAM file: %w", err)
	}
	if p.Mode == First {
		// The remap unmaps every page the shared mapping maps: drop them
		// now, while the guest runs, so the pause unmaps only the few
		// touched from here to stop (the data stays in the file).
		if err := DropShared(p.m, dropChunk); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// remapBlocked says why the source's RAM cannot be remapped here, or nil.
func remapBlocked(m Mapping, req PlanRequest) error {
	if err := CanRemap(req.PID); err != nil {
		return err
	}
	// First makes the source's file the template's by a second name, and
	// Diff renames its copy to Own: both need one file system.
	var own, tpl unix.Stat_t
	if err := unix.Stat(filepath.Dir(req.Own), &own); err != nil {
		return fmt.Errorf("RAM directory: %w", err)
	}
	if err := unix.Stat(filepath.Dir(req.Template), &tpl); err != nil {
		return fmt.Errorf("template RAM directory: %w", err)
	}
	if own.Dev != tpl.Dev || (m.Shared && m.Dev != tpl.Dev) {
		return fmt.Errorf("guest RAM %s and the templates' %s are on different file systems, so no template can be the source's own file", filepath.Dir(req.Own), filepath.Dir(req.Template))
	}
	return nil
}

// dropChunk bounds each stop of QEMU's main thread while the pages of a
// shared RAM mapping are dropped before the pause (about 30 ms per 128 MiB
// resident on the reference host).
const dropChunk = 128 << 20

// passFD hands QEMU f with add-fd and returns its fd set and descriptor.
func passFD(ctx context.Context, mon Monitor, f *os.File) (fdset, fd int, err error) {
	var fds struct {
		FDSet int `json:"fdset-id"`
		FD    int `json:"fd"`
	}
	if err := mon.ExecuteWithFile(ctx, "add-fd", map[string]any{}, f, &fds); err != nil {
		return -1, -1, err
	}
	return fds.FDSet, fds.FD, nil
}

// removeFD closes an fd set passFD made; QEMU keeps what Remap dup'd.
func removeFD(ctx context.Context, mon Monitor, fdset int) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	mon.Execute(cctx, "remove-fd", map[string]any{"fdset-id": fdset}, nil)
	cancel()
}

// InPause gives the template its RAM file while the source is paused in w,
// after the device state was saved, and pushes its removal onto w's undo
// stack, for a step after it that fails. It returns the bytes copied in the
// pause. On error it has made no template file.
func (p *Plan) InPause(ctx context.Context, w *PauseWindow) (int64, error) {
	n, err := p.inPause(ctx)
	if err == nil && p.Mode == Delta {
		chain := p.chain
		w.OnFailure(func(context.Context) error {
			errs := []error{rmIfAny(p.req.Delta), rmIfAny(p.req.Base)}
			for _, l := range chain {
				errs = append(errs, rmIfAny(l))
			}
			return errors.Join(errs...)
		})
	} else if err == nil {
		w.OnFailure(func(context.Context) error { return os.Remove(p.req.Template) })
	}
	return n, err
}

func (p *Plan) inPause(ctx context.Context) (int64, error) {
	switch p.Mode {
	case Stream:
		// The device state carried all of RAM; children need a file of the
		// right size to map.
		return SaveRAM(ctx, p.req.RAM, p.req.Template, false, p.req.SizeBytes)
	case Copy:
		return SaveRAM(ctx, p.req.RAM, p.req.Template, true, p.req.SizeBytes)
	case Delta:
		return p.inPauseDelta(ctx)
	case Diff:
		st, err := CopyPrivate(ctx, p.m, p.base)
		if err != nil {
			return 0, err
		}
		if err := Remap(p.m, p.qemuFD, p.blockFD); err != nil {
			return st.CopiedBytes, err
		}
		if p.tmp != "" {
			// The copy is now what the source maps: it takes the
			// machine's own name (the old file lives on while a
			// template or child still has it).
			if err := os.Rename(p.tmp, p.req.Own); err != nil {
				return st.CopiedBytes, fmt.Errorf("name RAM file: %w", err)
			}
			p.tmp = ""
		}
		return st.CopiedBytes, link(p.req.Own, p.req.Template)
	default: // First
		if err := Remap(p.m, p.qemuFD, p.blockFD); err != nil {
			return 0, err
		}
		return 0, link(p.req.Own, p.req.Template)
	}
}

// link gives the source's RAM file its template name, read-only as a
// reminder (children get the file from vmfork, read-only).
func link(own, tpl string) error {
	if err := os.Link(own, tpl); err != nil {
		return fmt.Errorf("name template RAM file: %w", err)
	}
	if err := os.Chmod(tpl, 0o400); err != nil {
		os.Remove(tpl)
		return fmt.Errorf("name template RAM file: %w", err)
	}
	return nil
}

// Cleanup releases what Prepare made and the freeze no longer needs: the
// descriptor QEMU got (Remap made its own copy), and a copy that never became
// the source's RAM. Idempotent.
func (p *Plan) Cleanup(ctx context.Context, mon Monitor) {
	if p.fdset >= 0 {
		removeFD(ctx, mon, p.fdset)
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
	if p.delta != nil {
		p.delta.Close()
		p.delta = nil
	}
	if p.deltaTmp != "" {
		os.Remove(p.deltaTmp)
		p.deltaTmp = ""
	}
	if p.baseLinked {
		os.Remove(p.req.Base)
		p.unlinkChain()
		p.baseLinked = false
	}
}

// rmIfAny removes path, which may not exist.
func rmIfAny(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// MapTemplate remaps the RAM of a QEMU that is starting (process pid, its
// guest not run yet) privately onto the template file: the process maps a
// fresh file start share=on (so that its own forks are Diff, not Stream),
// and from here sees the template instead, copy-on-write. Its RAM block
// stays share=on for x-ignore-shared. It fails, changing nothing, when start
// is the template itself: mapped shared, the child would write it.
func MapTemplate(ctx context.Context, mon Monitor, pid int, start, template string, sizeBytes int64) error {
	var st, tst unix.Stat_t
	if err := unix.Stat(start, &st); err != nil {
		return fmt.Errorf("map template RAM: %w", err)
	}
	f, err := os.Open(template)
	if err != nil {
		return fmt.Errorf("map template RAM: %w", err)
	}
	defer f.Close()
	if err := unix.Fstat(int(f.Fd()), &tst); err != nil {
		return fmt.Errorf("map template RAM: %w", err)
	}
	if st.Ino == tst.Ino && st.Dev == tst.Dev {
		return fmt.Errorf("map template RAM: %s is the template %s itself, mapped shared", start, template)
	}
	m, err := FindRAM(pid, sizeBytes, "", st.Ino)
	if err != nil {
		return fmt.Errorf("map template RAM: %w", err)
	}
	if !m.Shared {
		return fmt.Errorf("map template RAM: pid %d maps %s privately, not shared", pid, start)
	}
	blockFD, err := FDOf(pid, m.Dev, m.Inode)
	if err != nil {
		return fmt.Errorf("map template RAM: %w", err)
	}
	fdset, fd, err := passFD(ctx, mon, f)
	if err != nil {
		return fmt.Errorf("pass template RAM file: %w", err)
	}
	defer removeFD(ctx, mon, fdset)
	if err := Remap(m, fd, blockFD); err != nil {
		return fmt.Errorf("map template RAM: %w", err)
	}
	return nil
}

// MapsTemplate reports whether process pid maps the template file privately
// as its guest RAM, as MapTemplate left it.
func MapsTemplate(pid int, template string, sizeBytes int64) error {
	var st unix.Stat_t
	if err := unix.Stat(template, &st); err != nil {
		return err
	}
	m, err := FindRAM(pid, sizeBytes, "", st.Ino)
	if err != nil {
		return err
	}
	if m.Shared || m.Dev != st.Dev {
		return errors.New("the template is not mapped privately")
	}
	return nil
}
