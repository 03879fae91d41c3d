package contract

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
)

// SecretFiles are secrets a machine holds in its own files: an API token,
// a session cookie, a cache of credentials. A fork child is a perfect copy
// of its parent, so it holds the same files; these are the ones it must
// not keep. In YAML:
//
//	secret_files:
//	  wipe: [/var/cache/app/session]      # deleted in each child
//	  rotate:                             # each child's own value
//	    /etc/app/token: {exec: 'mint-token --for "$VMFORK_NAME"'}
//
// Both happen in each child before its NIC comes up, as identity steps of
// their own (vmfork.secret-files.wipe, then vmfork.secret-files.rotate);
// the parent's files never change.
type SecretFiles struct {
	// Wipe are files deleted in each child (one already absent is fine).
	Wipe []string `json:"wipe,omitempty" yaml:"wipe,omitempty"`
	// Rotate are files each child gets its own value in, by path: mode
	// 0600, the file's owner kept (root's for a file the child lacks).
	Rotate map[string]Rotate `json:"rotate,omitempty" yaml:"rotate,omitempty"`
}

// Rotate says where a rotated file's value comes from.
type Rotate struct {
	// Exec is a command run on the host (through /bin/sh -c) for each
	// child, with its name, parent and index in VMFORK_NAME,
	// VMFORK_PARENT and VMFORK_INDEX, as a secret's value_from.exec; its
	// standard output, byte for byte, is the file's new content.
	Exec string `json:"exec" yaml:"exec"`
}

// maxSecretFiles bounds how many files one contract wipes and rotates
// together: each is a line of the guest's work, and a rotated file's
// value travels in one guest command.
const maxSecretFiles = 64

// maxPathBytes is Linux's PATH_MAX, less its final NUL.
const maxPathBytes = 4095

func (f *SecretFiles) empty() bool { return f == nil || len(f.Wipe)+len(f.Rotate) == 0 }

// RotatePaths returns the files f rotates, sorted (nil for a nil f).
func (f *SecretFiles) RotatePaths() []string {
	if f == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(f.Rotate))
}

func (f *SecretFiles) validate() error {
	if n := len(f.Wipe) + len(f.Rotate); n > maxSecretFiles {
		return invalid("secret_files", "lists %d files, more than %d", n, maxSecretFiles)
	}
	wiped := make(map[string]int, len(f.Wipe))
	for i, p := range f.Wipe {
		field := fmt.Sprintf("secret_files.wipe[%d]", i)
		if err := checkGuestPath(field, p); err != nil {
			return err
		}
		if j, ok := wiped[p]; ok {
			return invalid(field, "%q is listed twice (also secret_files.wipe[%d])", p, j)
		}
		wiped[p] = i
	}
	for _, p := range f.RotatePaths() {
		field := "secret_files.rotate." + p
		if err := checkGuestPath(field, p); err != nil {
			return err
		}
		if j, ok := wiped[p]; ok {
			return invalid(field, "is also wiped (secret_files.wipe[%d]): a file is either wiped or rotated", j)
		}
		if strings.TrimSpace(f.Rotate[p].Exec) == "" {
			return invalid(field+".exec", "is empty: want the host command that prints each child's value")
		}
	}
	return nil
}

// checkGuestPath refuses what cannot name one file in the guest, the same
// way in every guest: a relative path, a .. (which a symlink in the guest
// would resolve), a path that is not clean, / itself, and control
// characters (a line break would end a line of the steps' input).
func checkGuestPath(field, p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return invalid(field, "%q must be an absolute path", p)
	case slices.Contains(strings.Split(p, "/"), ".."):
		return invalid(field, "%q must not hold ..", p)
	case p == "/":
		return invalid(field, "%q is not a file", p)
	case path.Clean(p) != p:
		return invalid(field, "%q is not a clean path (want %q)", p, path.Clean(p))
	case len(p) > maxPathBytes:
		return invalid(field, "is longer than %d bytes", maxPathBytes)
	case strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return invalid(field, "%q holds a control character", p)
	}
	return nil
}
