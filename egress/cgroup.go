package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// CgroupParent is the cgroup, under the cgroup2 root, that holds one
// cgroup per machine on user-mode networking. It sits at the root, not
// under vmfork's own cgroup, because QEMU outlives the vmfork command
// that starts it (and under systemd that command's cgroup is a scope
// removed when it ends).
const CgroupParent = "vmfork"

// Cgroup is a machine's cgroup v2: its QEMU, and so every socket slirp
// opens for the guest, lives in it, and the machine's inet table matches
// those sockets by it (socket cgroupv2).
type Cgroup struct {
	// Path is its directory in the cgroup2 mount.
	Path string
	// Rel is its path below the cgroup2 root: CgroupParent/MACHINE.
	Rel string
	// ID is its cgroup id, the directory's inode number: what the kernel
	// compares a socket's cgroup with.
	ID uint64
	// Level is its depth below the root (2): socket cgroupv2 compares the
	// socket's cgroup's ancestor at this level, so processes in child
	// cgroups of it match too.
	Level uint32
}

// Cgroup2Mount returns where cgroup v2 is mounted, from
// /proc/self/mountinfo: /sys/fs/cgroup on a unified host,
// /sys/fs/cgroup/unified on a hybrid one (v1 controllers beside it), and
// an error wrapping ErrUnavailable on a v1-only host.
func Cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("egress: find the cgroup2 mount: %w", err)
	}
	defer f.Close()
	return cgroup2Mount(f)
}

func cgroup2Mount(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 1 || g[0] != "cgroup2" {
			continue
		}
		// A cgroup2 mounted from below its root (ROOT not /, as inside
		// a container) would give ids and levels of another tree.
		if f[3] != "/" {
			continue
		}
		return unescapeMount(f[4]), nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("egress: find the cgroup2 mount: %w", err)
	}
	return "", fmt.Errorf("egress: no cgroup2 mounted at its root (/proc/self/mountinfo), so user-mode networking's sockets cannot be told apart: %w", ErrUnavailable)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// CreateCgroup makes machine's cgroup (and CgroupParent) if missing and
// returns it. It is idempotent.
func CreateCgroup(machine string) (*Cgroup, error) {
	if err := checkMachine(machine); err != nil {
		return nil, err
	}
	root, err := Cgroup2Mount()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, CgroupParent, machine)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("egress: create machine %s's cgroup: %w", machine, err)
	}
	return openCgroup(root, machine)
}

// OpenCgroup returns machine's cgroup; an error naming it when it does not
// exist (wrapping fs.ErrNotExist).
func OpenCgroup(machine string) (*Cgroup, error) {
	if err := checkMachine(machine); err != nil {
		return nil, err
	}
	root, err := Cgroup2Mount()
	if err != nil {
		return nil, err
	}
	return openCgroup(root, machine)
}

func openCgroup(root, machine string) (*Cgroup, error) {
	rel := CgroupParent + "/" + machine
	c := &Cgroup{Path: filepath.Join(root, rel), Rel: rel, Level: 2}
	id, err := c.inode()
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	c.ID = id
	return c, nil
}

// inode is the cgroup's id: its directory's inode number, which cgroup2
// (kernfs) makes the cgroup id on 64-bit kernels; nft resolves a
// cgroupv2 path the same way.
func (c *Cgroup) inode() (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(c.Path, "cgroup.procs"), &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("cgroup %s does not exist: %w", c.Rel, fs.ErrNotExist)
		}
		return 0, fmt.Errorf("cgroup %s: %w", c.Rel, err)
	}
	if err := syscall.Stat(c.Path, &st); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", c.Rel, err)
	}
	return st.Ino, nil
}

// check reports whether c still names the cgroup it named when opened: a
// cgroup removed and made again has another id, which rules made from
// the old one would never match.
func (c *Cgroup) check() error {
	if c == nil {
		return errors.New("no cgroup")
	}
	id, err := c.inode()
	if err != nil {
		return err
	}
	if id != c.ID {
		return fmt.Errorf("cgroup %s was made again since it was opened (id %d, was %d)", c.Rel, id, c.ID)
	}
	return nil
}

// Add moves process pid (all its threads) into c. A socket keeps the
// cgroup it was made in, so move QEMU before it makes the guest's
// sockets; better, start it inside (syscall.SysProcAttr's UseCgroupFD and
// CgroupFD, with c.Path opened as a directory: clone3 places the child
// before it runs).
func (c *Cgroup) Add(pid int) error {
	if err := c.check(); err != nil {
		return fmt.Errorf("egress: put process %d in a cgroup: %w", pid, err)
	}
	f, err := os.OpenFile(filepath.Join(c.Path, "cgroup.procs"), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("egress: put process %d in cgroup %s: %w", pid, c.Rel, err)
	}
	_, err = f.WriteString(strconv.Itoa(pid))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("egress: put process %d in cgroup %s: %w", pid, c.Rel, err)
	}
	return nil
}

// Procs returns the processes in c.
func (c *Cgroup) Procs() ([]int, error) {
	data, err := os.ReadFile(filepath.Join(c.Path, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("egress: cgroup %s: %w", c.Rel, err)
	}
	var pids []int
	for _, l := range strings.Fields(string(data)) {
		if p, err := strconv.Atoi(l); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// RemoveCgroup removes machine's cgroup. It is idempotent; a cgroup that
// still holds processes (QEMU has not exited) is an error naming it.
// CgroupParent stays.
func RemoveCgroup(machine string) error {
	if err := checkMachine(machine); err != nil {
		return err
	}
	root, err := Cgroup2Mount()
	if err != nil {
		return err
	}
	rel := CgroupParent + "/" + machine
	err = os.Remove(filepath.Join(root, rel))
	switch {
	case err == nil || errors.Is(err, fs.ErrNotExist):
		return nil
	case errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("egress: remove cgroup %s: it still holds processes", rel)
	}
	return fmt.Errorf("egress: remove cgroup %s: %w", rel, err)
}
