package sharedmem

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mapping is the mapping of one guest RAM file in a QEMU process, as
// /proc/PID/maps shows it: the file that backs the guest's memory now, which
// after a remap (remap_linux_amd64.go) is no longer the file QEMU opened.
type Mapping struct {
	PID        int
	Start, End uintptr
	Offset     int64
	Shared     bool // MAP_SHARED; false for a private (copy-on-write) mapping
	Dev, Inode uint64
	Path       string // the name the kernel shows; may be gone ("(deleted)")
	// Overlays are the runs of the region that show other files than
	// this one: a child's mapped deltas (overlay.go), its own pages.
	Overlays []Overlay
	// fileStart, fileEnd are the addresses of the piece of the region
	// that maps this file, where Overlays split it (zero: all of it):
	// /proc/PID/map_files names one VMA.
	fileStart, fileEnd uintptr
}

// Size is the mapping's length in bytes.
func (m Mapping) Size() int64 { return int64(m.End - m.Start) }

// File opens the mapped file itself, whatever its names are now (it may have
// none): through /proc/PID/map_files where this process may (opening there
// needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), and otherwise through the
// process's own descriptor of that file, /proc/PID/fd/N, which its owner may
// open too. QEMU always holds one: the RAM file it opened, and after a remap
// the file Remap dup'd over that descriptor (remap_linux_amd64.go).
func (m Mapping) File(flag int) (*os.File, error) {
	start, end := m.Start, m.End
	if m.fileEnd != 0 {
		start, end = m.fileStart, m.fileEnd
	}
	p := fmt.Sprintf("/proc/%d/map_files/%x-%x", m.PID, start, end)
	f, err := os.OpenFile(p, flag, 0)
	if err == nil {
		return f, nil
	}
	if !errors.Is(err, os.ErrPermission) {
		return nil, fmt.Errorf("open RAM mapping of pid %d: %w", m.PID, err)
	}
	return m.fileByFD(flag)
}

// fileByFD opens the mapped file through the descriptor of m's process that
// refers to it, and checks that what it opened is still that file (the
// descriptor could have been replaced meanwhile).
func (m Mapping) fileByFD(flag int) (*os.File, error) {
	fd, err := FDOf(m.PID, m.Dev, m.Inode)
	if err != nil {
		return nil, fmt.Errorf("open RAM mapping of pid %d: %w", m.PID, err)
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", m.PID, fd), flag, 0)
	if err != nil {
		return nil, fmt.Errorf("open RAM mapping of pid %d: %w", m.PID, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Ino != m.Inode || st.Dev != m.Dev {
		f.Close()
		return nil, fmt.Errorf("open RAM mapping of pid %d: descriptor %d no longer refers to its RAM file (inode %d)", m.PID, fd, m.Inode)
	}
	return f, nil
}

// Writable opens the mapped file read-write for a caller that knows no one
// else can see it (Exclusive). The file may be read-only by its mode: a
// machine's own file that was a template's too keeps the template's 0400
// after that name is gone. Root writes it anyway; its owner makes it 0600
// first, which changes nothing for anyone else, since no one else has it.
func (m Mapping) Writable() (*os.File, error) {
	f, err := m.File(os.O_RDWR)
	if err == nil || !errors.Is(err, os.ErrPermission) {
		return f, err
	}
	ro, err := m.File(os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer ro.Close()
	if err := unix.Fchmod(int(ro.Fd()), 0o600); err != nil {
		return nil, fmt.Errorf("make RAM file of pid %d writable: %w", m.PID, err)
	}
	f, err = os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(ro.Fd())), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("make RAM file of pid %d writable: %w", m.PID, err)
	}
	return f, nil
}

// ErrNoMapping is returned when a process maps no file of the wanted size.
var ErrNoMapping = errors.New("no guest RAM mapping found")

// FindRAM finds the guest RAM mapping of process pid: the one file mapping of
// exactly size bytes whose name ends in suffix (".ram"), or, with inode set,
// the mapping of that inode. Guest RAM files are the only files QEMU maps at
// such sizes, and QEMU maps each in one piece; a child that mapped deltas
// over its base has it in pieces (findSplit), found by the base's inode or
// name.
func FindRAM(pid int, size int64, suffix string, inode uint64) (Mapping, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return Mapping{}, fmt.Errorf("read mappings of pid %d: %w", pid, err)
	}
	ms, err := parseMaps(pid, data)
	if err != nil {
		return Mapping{}, err
	}
	for _, m := range ms {
		if m.Size() != size || m.Inode == 0 {
			continue
		}
		if inode != 0 && m.Inode == inode {
			return m, nil
		}
		name := strings.TrimSuffix(m.Path, " (deleted)")
		if inode == 0 && strings.HasSuffix(name, suffix) {
			return m, nil
		}
	}
	isBase := func(m Mapping) bool {
		if inode != 0 {
			return m.Inode == inode
		}
		return strings.HasSuffix(strings.TrimSuffix(m.Path, " (deleted)"), suffix)
	}
	if m, ok := findSplit(ms, size, isBase); ok {
		return m, nil
	}
	return Mapping{}, fmt.Errorf("pid %d, %d bytes: %w", pid, size, ErrNoMapping)
}

// parseMaps parses /proc/PID/maps and merges adjacent lines of one mapping
// (the kernel splits a mapping where flags such as madvise hints differ).
func parseMaps(pid int, data []byte) ([]Mapping, error) {
	var out []Mapping
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		off, err3 := strconv.ParseInt(f[2], 16, 64)
		ino, err4 := strconv.ParseUint(f[4], 10, 64)
		maj, min, ok2 := strings.Cut(f[3], ":")
		dmaj, err5 := strconv.ParseUint(maj, 16, 32)
		dmin, err6 := strconv.ParseUint(min, 16, 32)
		if !ok || !ok2 || errors.Join(err1, err2, err3, err4, err5, err6) != nil || len(f[1]) != 4 {
			return nil, fmt.Errorf("maps of pid %d: bad line %q", pid, sc.Text())
		}
		m := Mapping{
			PID: pid, Start: uintptr(start), End: uintptr(end), Offset: off,
			Shared: f[1][3] == 's', Dev: unix.Mkdev(uint32(dmaj), uint32(dmin)), Inode: ino,
		}
		if len(f) > 5 {
			m.Path = strings.Join(f[5:], " ")
		}
		if n := len(out); n > 0 && ino != 0 {
			p := &out[n-1]
			if p.Inode == ino && p.Dev == m.Dev && p.End == m.Start && p.Shared == m.Shared &&
				p.Offset+p.Size() == m.Offset {
				p.End = m.End
				continue
			}
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// mappers returns the pids, other than except, of the processes that map the
// file (dev, inode). It is a second line of defence: a RAM file with no name
// but its owner's can no longer be opened, and vmfork frees a template's
// name only when no machine of its own maps it; the scan catches a process
// left over by a crash. Processes whose maps even root may not read (a
// sandbox's own init) cannot have opened a vmfork RAM file and are skipped.
func mappers(dev, inode uint64, except int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == except {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/maps")
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) || errors.Is(err, os.ErrPermission) {
			continue // exited meanwhile, or not ours to read
		}
		if err != nil {
			out = append(out, pid)
			continue
		}
		// A cheap text test first: most processes map nothing on tmpfs.
		if !bytes.Contains(data, []byte(" "+strconv.FormatUint(inode, 10))) {
			continue
		}
		ms, err := parseMaps(pid, data)
		if err != nil {
			out = append(out, pid)
			continue
		}
		for _, m := range ms {
			if m.Inode == inode && m.Dev == dev {
				out = append(out, pid)
				break
			}
		}
	}
	return out, nil
}

// FDOf returns the descriptor of process pid that refers to the file (dev,
// inode): QEMU's own handle on its RAM file.
func FDOf(pid int, dev, inode uint64) (int, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return -1, fmt.Errorf("descriptors of pid %d: %w", pid, err)
	}
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Stat(dir+"/"+e.Name(), &st) != nil || st.Ino != inode || st.Dev != dev {
			continue
		}
		if fd, err := strconv.Atoi(e.Name()); err == nil {
			return fd, nil
		}
	}
	return -1, fmt.Errorf("pid %d holds no descriptor of its RAM file (inode %d)", pid, inode)
}

// Exclusive reports whether name is the only name of m's file and no process
// but m's maps it: then no template and no child can see that file, and its
// owner may write it.
func Exclusive(m Mapping, name string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(name, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("stat %s: %w", name, err)
	}
	if st.Ino != m.Inode || st.Dev != m.Dev || st.Nlink != 1 {
		return false, nil
	}
	others, err := mappers(m.Dev, m.Inode, m.PID)
	if err != nil {
		return false, err
	}
	return len(others) == 0, nil
}

// CopyMapped copies the file that m maps (its data extents; holes stay
// holes) to a new file at path and returns it open read-write. The mapped
// file must be frozen (a private mapping's file), so this runs while the
// process does.
func CopyMapped(ctx context.Context, m Mapping, path string) (f *os.File, copied int64, err error) {
	in, err := m.File(os.O_RDONLY)
	if err != nil {
		return nil, 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("copy RAM base: %w", err)
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(path)
		}
	}()
	fi, err := in.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("copy RAM base: %w", err)
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return nil, 0, fmt.Errorf("copy RAM base: %w", err)
	}
	if copied, err = copyExtents(ctx, in, out, fi.Size()); err != nil {
		return nil, 0, fmt.Errorf("copy RAM base: %w", err)
	}
	return out, copied, nil
}
