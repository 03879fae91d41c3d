package vmfork

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/vmfork/vmfork/overlay"
)

// validateOnHost checks what in a spec this host must be able to give: a
// base disk that really is a disk image, and guest RAM the host has. Both
// would otherwise reach QEMU, which boots a text file as a raw disk and
// dies (or the host's OOM killer strikes) on RAM it cannot back.
func (s *Spec) validateOnHost() error {
	if s.Disk != "" {
		if err := overlay.CheckBase(s.Disk); err != nil {
			return fmt.Errorf("%w: %w", err, ErrInvalid)
		}
	}
	if total, err := hostMemoryMiB(); err == nil && s.MemoryMiB > total {
		return fmt.Errorf("memory %d MiB is more than this host has (%d MiB): %w", s.MemoryMiB, total, ErrInvalid)
	}
	return nil
}

// hostMemoryMiB reads MemTotal from /proc/meminfo.
func hostMemoryMiB() (int, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kib, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				return 0, fmt.Errorf("read /proc/meminfo: MemTotal %q", v)
			}
			return kib / 1024, nil
		}
	}
	return 0, fmt.Errorf("read /proc/meminfo: no MemTotal")
}
