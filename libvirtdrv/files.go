package libvirtdrv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// within reports whether path is dir or lies below it.
func within(dir, path string) bool {
	rel, err := filepath.Rel(filepath.Clean(dir), filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// searchable reports whether a process running as uid:gid may search
// directory st, by its mode bits. libvirt starts QEMU without
// CAP_DAC_OVERRIDE, so even a QEMU running as root is bound by them.
// Supplementary groups and ACLs are not considered.
func searchable(st fs.FileInfo, uid, gid int) bool {
	mode := st.Mode().Perm()
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		switch {
		case int(sys.Uid) == uid:
			return mode&0o100 != 0
		case int(sys.Gid) == gid:
			return mode&0o010 != 0
		}
	}
	return mode&0o001 != 0
}

// checkReach returns an error naming the first directory above stateDir that
// a QEMU running as uid:gid cannot search. vmfork changes no directory that
// is not its own, so that is for the host's owner to decide.
func checkReach(stateDir string, uid, gid int) error {
	for dir := filepath.Dir(filepath.Clean(stateDir)); ; dir = filepath.Dir(dir) {
		st, err := os.Stat(dir)
		if err != nil {
			return err
		}
		if !searchable(st, uid, gid) {
			return fmt.Errorf("QEMU runs as uid %d gid %d and cannot search %s, above vmfork's state dir %s, "+
				"so it could not open the overlays vmfork puts there: give it search permission (chmod o+x %s) or use a state dir it can reach",
				uid, gid, dir, stateDir, dir)
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}

// grantSearch lets a QEMU running as uid:gid open files in dirs, each in
// stateDir: every directory from each one up to stateDir that QEMU cannot
// search gets search permission for others. Never read permission: the
// names in them stay unlisted. An adopted domain's QEMU usually runs as
// libvirt's own user, and vmfork makes its directories 0700.
func grantSearch(stateDir string, uid, gid int, dirs ...string) error {
	if err := checkReach(stateDir, uid, gid); err != nil {
		return err
	}
	for _, dir := range dirs {
		for p := filepath.Clean(dir); within(stateDir, p); p = filepath.Dir(p) {
			st, err := os.Stat(p)
			if err != nil {
				return err
			}
			if !searchable(st, uid, gid) {
				if err := os.Chmod(p, st.Mode().Perm()|0o001); err != nil {
					return fmt.Errorf("let QEMU reach %s: %w", dir, err)
				}
			}
			if p == filepath.Clean(stateDir) {
				break
			}
		}
	}
	return nil
}

// qcow2Magic starts every qcow2 image.
var qcow2Magic = []byte{'Q', 'F', 'I', 0xfb}

// relativeBacking reports whether the image at path names its backing file
// relative to its own directory. Such an image reads another file when it is
// opened under a name in another directory, such as a hard link in a
// template's directory. A raw image has no backing file.
func relativeBacking(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	// qcow2 header: magic, version (4 bytes each), backing file offset (8)
	// and size (4), big-endian.
	var h [20]byte
	if _, err := io.ReadFull(f, h[:]); errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	if string(h[:4]) != string(qcow2Magic) {
		return false, nil
	}
	off, size := binary.BigEndian.Uint64(h[8:16]), binary.BigEndian.Uint32(h[16:20])
	if off == 0 || size == 0 {
		return false, nil
	}
	if size > 1023 {
		return false, fmt.Errorf("read %s: backing file name of %d bytes", path, size)
	}
	name := make([]byte, size)
	if _, err := f.ReadAt(name, int64(off)); err != nil {
		return false, fmt.Errorf("read %s: backing file name: %w", path, err)
	}
	// Only a plain path can be relative; "json:" and protocol names are not.
	s := string(name)
	return !filepath.IsAbs(s) && !strings.Contains(s, ":"), nil
}
