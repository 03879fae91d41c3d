package vmfork

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Why a machine is stopped, as far as vmfork can tell (ls). A machine that
// vmfork stopped has its reason in its record; one whose record still says
// it runs has none, and its reason is derived each time its state is read
// (refreshState): the host's boot id and the mem dir say whether the host
// restarted under it, or its QEMU alone died.

// StopReason says why a machine is stopped; empty when it runs, or when
// vmfork cannot tell (a record older than the field).
type StopReason string

const (
	// StopByUser: vmfork stop (or a command that stops its machine, such
	// as a rewind that failed) stopped it.
	StopByUser StopReason = "user"
	// StopQEMUDied: its QEMU ended without vmfork ending it (killed, OOM,
	// a crash, a guest that powered itself off); its RAM's file is there.
	StopQEMUDied StopReason = "qemu-died"
	// StopHostRestart: the host restarted (its boot id changed) or the mem
	// dir was emptied under it: its RAM is gone with its QEMU.
	StopHostRestart StopReason = "host-restart"
)

// Text is the reason as ls's table shows it.
func (r StopReason) Text() string {
	switch r {
	case StopByUser:
		return "stopped by the user"
	case StopQEMUDied:
		return "its QEMU died"
	case StopHostRestart:
		return "host restarted: RAM gone"
	}
	return ""
}

// deriveStopReason is why a machine is stopped now. recorded is the state
// its record holds, and reason the reason it records; hostRestarted says
// that the host booted since the record was saved, ramGone that the RAM
// file it mapped in the mem dir is gone.
func deriveStopReason(recorded State, reason StopReason, hostRestarted, ramGone bool) StopReason {
	switch {
	case recorded == StateStopped:
		return reason // vmfork stopped it, and said why then
	case hostRestarted || ramGone:
		return StopHostRestart
	default:
		return StopQEMUDied
	}
}

// stopReason derives why m, whose record says recorded, is stopped now.
func (mg *Manager) stopReason(m *Machine, recorded State) StopReason {
	restarted := m.HostBoot != "" && hostBootID() != "" && m.HostBoot != hostBootID()
	return deriveStopReason(recorded, m.StopReason, restarted, mg.Store.ramGone(m.Paths.RAM))
}

// ramGone reports whether ram, a RAM file in the mem dir, does not exist.
// A file elsewhere (libvirt's own memory_backing_dir, which libvirt empties
// itself when a domain ends) tells nothing, and counts as there.
func (s *Store) ramGone(ram string) bool {
	if ram == "" {
		return false
	}
	rel, err := filepath.Rel(s.MemDir, ram)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return false
	}
	_, err = os.Stat(ram)
	return errors.Is(err, fs.ErrNotExist)
}

// hostBootID is this boot's id (/proc/sys/kernel/random/boot_id), or ""
// where the kernel does not say.
var hostBootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})
