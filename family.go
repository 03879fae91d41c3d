package vmfork

import (
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
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
// port from it; the Manager registers it with the ledger.
func (m *Machine) LedgerSocket() string {
	if !m.Spec.LedgerPort {
		return ""
	}
	if m.Paths.Ledger != "" {
		return m.Paths.Ledger
	}
	return filepath.Join(m.Paths.Dir, fileLedger)
}
