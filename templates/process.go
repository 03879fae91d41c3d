package templates

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
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state is the field after the parenthesised command name.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z' && stat[i+2] != 'X'
	}
	return true
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
