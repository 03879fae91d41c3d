package proc

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"time"
)

// Alive reports whether pid is a live (not zombie) process whose command line contains marker.
// The marker (such as the machine's QMP socket path) guards against a PID that another process
// reused after QEMU exited.
func Alive(pid int, marker string) bool {
	if pid <= 0 {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !bytes.Contains(cmdline, []byte(marker)) {
		return false
	}
	return Running(pid)
}

// Running reports whether pid is a process that has not exited. A zombie
// counts as exited: kill(pid, 0) still succeeds for one, and on hosts whose
// PID 1 reaps orphans late a dead QEMU or daemon can linger that way for a
// long time.
func Running(pid int) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	return !zombie(stat)
}

// zombie reads the state field of a /proc/PID/stat line: the field after
// the parenthesised command name, which may itself hold spaces and ')'.
func zombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	return stat[i+2] == 'Z' || stat[i+2] == 'X'
}

// WaitGone polls until Alive(pid, marker) is false or ctx ends.
func WaitGone(ctx context.Context, pid int, marker string) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for Alive(pid, marker) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
