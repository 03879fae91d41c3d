package vmfork

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// A family is a root machine (one booted or adopted, or a template
// imported) and everything made from it: fork children, forks of forks,
// kept templates and their children, checkpoints and rewinds, explore
// branches, hibernated and resumed machines. Its id is drawn when the root
// is made and inherited by every template and child, so that the family
// ledger (package ledger, ledger.go) can answer for a whole family and keep
// families apart. A rewind or a resume keeps the machine's record, and with
// it its family.

// newFamily draws a family id.
func newFamily() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "f" + hex.EncodeToString(b[:])
}

// familyOf is m's family: its own, or, for a record from before vmfork
// kept families, one named after the machine (its children then share
// it; machines forked from it before are a family of their own each).
func familyOf(m *Machine) string {
	if m.Family != "" {
		return m.Family
	}
	return "m-" + m.Name
}

// LedgerSocket is the unix socket machine m's QEMU listens on for the
// family ledger's port, "" when m has no port (a machine made before
// vmfork gave one, an adopted domain, their children). Drivers render the
// port from it (after PrepareLedgerSocket); the Manager registers it with
// the ledger.
//
// It is <machine dir>/ledger.sock, unless that path is longer than a unix
// socket's address can hold (sun_path: 108 bytes with its NUL; a deep
// state dir): then a short path of its own in LedgerRunDir, named by a
// digest of the long one, so that every vmfork command finds the same.
func (m *Machine) LedgerSocket() string {
	if !m.Spec.LedgerPort {
		return ""
	}
	p := m.Paths.Ledger
	if p == "" {
		p = filepath.Join(m.Paths.Dir, fileLedger)
	}
	if len(p) <= maxSocketPath {
		return p
	}
	sum := sha256.Sum256([]byte(p))
	return filepath.Join(LedgerRunDir, hex.EncodeToString(sum[:12])+".sock")
}

// maxSocketPath is the longest path a unix socket can be bound at.
const maxSocketPath = 107

// LedgerRunDir holds the ledger sockets of machines whose own directory is
// too deep for one (LedgerSocket); a variable for tests. Root's is in /run;
// another user may not write there, and gets one of its own on the tmpfs
// its default mem dir is on (not /tmp, where a cleaner could remove the
// socket of a long-running machine), checked to be its own.
var LedgerRunDir = ledgerRunDir(os.Geteuid())

func ledgerRunDir(uid int) string {
	if uid == 0 {
		return "/run/vmfork/ledger"
	}
	return "/dev/shm/vmfork-" + strconv.Itoa(uid) + "-ledger"
}

// PrepareLedgerSocket makes the directory of m's ledger socket where it is
// not m's own (LedgerRunDir) and removes a socket a QEMU that is gone left
// there; drivers call it before they start m's QEMU.
func (m *Machine) PrepareLedgerSocket() error {
	sock := m.LedgerSocket()
	if sock == "" || filepath.Dir(sock) != LedgerRunDir {
		return nil
	}
	if err := os.MkdirAll(LedgerRunDir, 0o711); err != nil {
		return fmt.Errorf("machine %q: ledger socket: %w", m.Name, err)
	}
	// Anyone may make the directory first in /dev/shm: one another user
	// owns or may write in could swap the socket.
	st, err := os.Lstat(LedgerRunDir)
	if err != nil {
		return fmt.Errorf("machine %q: ledger socket: %w", m.Name, err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("machine %q: ledger socket: %s belongs to uid %d, not to you (uid %d): its owner could swap the socket; have it removed: %w",
			m.Name, LedgerRunDir, sys.Uid, os.Geteuid(), ErrInvalid)
	}
	if !st.IsDir() || st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("machine %q: ledger socket: %s is not a directory only you may write in (mode %s): remove it: %w", m.Name, LedgerRunDir, st.Mode(), ErrInvalid)
	}
	if err := os.Remove(sock); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("machine %q: ledger socket: %w", m.Name, err)
	}
	return nil
}
