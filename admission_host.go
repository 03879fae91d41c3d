package vmfork

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/sharedmem"
)

// HostProbe is what admission (admission.go) reads of the host. The real
// one reads /proc and statfs; tests give a fake, so the policy is tested
// without guests or a host of a given size.
type HostProbe interface {
	// Memory returns MemTotal and MemAvailable (/proc/meminfo), in bytes.
	Memory() (total, available int64, err error)
	// Space returns the file system under dir: its free and whole size in
	// bytes, and whether it is a tmpfs (whose files are memory).
	Space(dir string) (DirSpace, error)
	// PrivateRAM returns what machine m's process holds that no other
	// process shares (private dirty memory); ok is false when its process
	// is not there to ask.
	PrivateRAM(m *Machine) (n int64, ok bool)
	// CPUPressure returns the share of the last 10 s in which some runnable
	// task waited for a CPU (/proc/pressure/cpu, "some avg10"), from 0 to
	// 100; ok is false where the kernel has no pressure stall information.
	CPUPressure() (pct float64, ok bool)
	// CPUTicks returns the CPU time process pid has used, in clock ticks;
	// ok is false when it is gone.
	CPUTicks(pid int) (ticks int64, ok bool)
}

// DirSpace is a file system's space.
type DirSpace struct {
	Free, Size int64
	Tmpfs      bool
}

// procHost is the HostProbe of the machine vmfork runs on.
type procHost struct{}

func (procHost) Memory() (total, available int64, err error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, fmt.Errorf("host memory: %w", err)
	}
	return parseMeminfo(data)
}

// parseMeminfo returns MemTotal and MemAvailable of a /proc/meminfo.
func parseMeminfo(data []byte) (total, available int64, err error) {
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, rest, _ := strings.Cut(sc.Text(), ":")
		var p *int64
		switch key {
		case "MemTotal":
			p = &total
		case "MemAvailable":
			p = &available
		default:
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("host memory: /proc/meminfo: bad line %q", sc.Text())
		}
		kb, perr := strconv.ParseInt(f[0], 10, 64)
		if perr != nil {
			return 0, 0, fmt.Errorf("host memory: /proc/meminfo: bad line %q", sc.Text())
		}
		*p = kb << 10
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("host memory: /proc/meminfo has no MemTotal or MemAvailable")
	}
	return total, available, nil
}

func (procHost) Space(dir string) (DirSpace, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return DirSpace{}, fmt.Errorf("space of %s: %w", dir, err)
	}
	return DirSpace{
		Free: int64(st.Bavail) * st.Bsize, Size: int64(st.Blocks) * st.Bsize,
		Tmpfs: st.Type == unix.TMPFS_MAGIC,
	}, nil
}

func (procHost) PrivateRAM(m *Machine) (int64, bool) {
	if m.PID <= 0 {
		return 0, false
	}
	// A record's pid may be stale, and reused by an unrelated process:
	// only a process whose command line names the machine counts (both
	// drivers' QEMUs name it: -name, or libvirt's guest=NAME).
	cmd, err := os.ReadFile("/proc/" + strconv.Itoa(m.PID) + "/cmdline")
	if err != nil || !bytes.Contains(cmd, []byte(m.Name)) {
		return 0, false
	}
	r, err := sharedmem.ReadRollup(m.PID)
	if err != nil {
		return 0, false
	}
	return r.PrivateDirty, true
}

func (procHost) CPUPressure() (float64, bool) {
	data, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return 0, false
	}
	return parseCPUPressure(data)
}

// parseCPUPressure returns the "some avg10" of a /proc/pressure/cpu.
func parseCPUPressure(data []byte) (float64, bool) {
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "some" {
			continue
		}
		for _, kv := range f[1:] {
			if v, ok := strings.CutPrefix(kv, "avg10="); ok {
				pct, err := strconv.ParseFloat(v, 64)
				return pct, err == nil
			}
		}
	}
	return 0, false
}

func (procHost) CPUTicks(pid int) (int64, bool) {
	if pid <= 0 {
		return 0, false
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	return parseStatTicks(data)
}

// parseStatTicks returns utime+stime of a /proc/PID/stat.
func parseStatTicks(data []byte) (int64, bool) {
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	return u + s, err1 == nil && err2 == nil
}
