package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Memory is where a child's PSS goes, read from /proc/PID/smaps.
type Memory struct {
	// GuestRAMBytes is guest RAM the child touched: for a fork child the
	// template pages it read plus the pages it copied on write.
	GuestRAMBytes int64 `json:"guest_ram_bytes"`
	// TCGBytes is TCG's translated code (anonymous executable memory); it
	// does not exist under KVM.
	TCGBytes int64 `json:"tcg_code_bytes"`
	// AnonBytes is QEMU's other anonymous memory: heap, device state,
	// TCG's translation metadata.
	AnonBytes int64 `json:"qemu_anon_bytes"`
	// FileBytes is the QEMU binary, libraries and other mapped files.
	FileBytes int64 `json:"file_bytes"`
}

// Total is the PSS the breakdown adds up to.
func (m Memory) Total() int64 { return m.GuestRAMBytes + m.TCGBytes + m.AnonBytes + m.FileBytes }

// readMemory reads a QEMU's memory by kind. Anonymous executable memory is
// TCG's code; any other mapping at least guestRAM long is the guest's RAM. If template is not empty, the mapping of that file (a
// template's frozen RAM) counts with its Rss rather than its PSS: as if the
// process were the only one mapping it. In peers the floor and the kept template
// load the template of a vmfork child that is still alive, and plain PSS
// would halve the template pages both touched and flatter them; vmfork's own
// child is read the same way, so all are compared as a child alone with its
// template. The burst shows sharing (plain PSS).
func readMemory(pid int, template string, guestRAM int64) (Memory, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		return Memory{}, fmt.Errorf("memory of pid %d: %w", pid, err)
	}
	return parseSmaps(data, template, guestRAM)
}

func parseSmaps(data []byte, template string, guestRAM int64) (Memory, error) {
	var m Memory
	var kind *int64
	alone, found := false, 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		key, rest, ok := strings.Cut(line, ":")
		if !ok || strings.ContainsAny(key, " -") {
			// A mapping's header: "start-end perms offset dev inode [path]".
			f := strings.Fields(line)
			if len(f) < 5 {
				return m, fmt.Errorf("smaps: bad header %q", line)
			}
			path := strings.TrimSuffix(strings.Join(f[5:], " "), " (deleted)")
			kind = mappingKind(&m, f[0], f[1], path, guestRAM)
			alone = template != "" && path == template
			continue
		}
		if kind == nil || !((key == "Pss" && !alone) || (key == "Rss" && alone)) {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return m, fmt.Errorf("smaps: bad line %q", line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return m, fmt.Errorf("smaps: bad line %q", line)
		}
		*kind += kb << 10
		found++
	}
	if found == 0 {
		return m, fmt.Errorf("smaps: no Pss lines")
	}
	return m, sc.Err()
}

// mappingKind says which figure of m a mapping adds to.
func mappingKind(m *Memory, addrs, perms, path string, guestRAM int64) *int64 {
	lo, hi, _ := strings.Cut(addrs, "-")
	a, _ := strconv.ParseUint(lo, 16, 64)
	b, _ := strconv.ParseUint(hi, 16, 64)
	anon := path == "" || strings.HasPrefix(path, "[")
	switch {
	case anon && strings.Contains(perms, "x"):
		// First: TCG's buffer can be larger than guest RAM (1 GiB by
		// default in 7.2; vmfork asks for 128 MiB).
		return &m.TCGBytes
	case guestRAM > 0 && b > a && int64(b-a) >= guestRAM:
		return &m.GuestRAMBytes
	case anon:
		return &m.AnonBytes
	default:
		return &m.FileBytes
	}
}
