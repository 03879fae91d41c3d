package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Files in the broker's directory (Config.Dir), besides the CA's.
const (
	// SocketFile is the control socket (0600): Register, Unregister, List.
	SocketFile = "broker.sock"
	// PIDFile holds the running broker's PID.
	PIDFile = "broker.pid"
	// RegistryFile lists the registered machines without their values
	// (0600), so that a broker started after one that died serves them
	// again.
	RegistryFile = "children.json"
	// LogFile is where a broker started by vmfork writes its log.
	LogFile = "broker.log"
	// lockFile is held (flock) by the running broker for its whole life:
	// a killed broker frees it, and whoever takes it knows none runs.
	lockFile = "broker.lock"
)

// registry is the registry file's form.
type registry struct {
	Children []Child `json:"children"`
}

func readRegistry(dir string) ([]Child, error) {
	data, err := os.ReadFile(filepath.Join(dir, RegistryFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r registry
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", RegistryFile, err)
	}
	return r.Children, nil
}

// writeRegistry writes children, without their values, sorted by name.
func writeRegistry(dir string, children []Child) error {
	r := registry{Children: make([]Child, 0, len(children))}
	for _, c := range children {
		r.Children = append(r.Children, c.clone(false))
	}
	slices.SortFunc(r.Children, func(a, b Child) int { return strings.Compare(a.Name, b.Name) })
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, RegistryFile), append(data, '\n'), 0o600)
}

// listenAddr opens a machine's listener.
func listenAddr(a Addr) (net.Listener, error) {
	if a.Network == "unix" {
		return listenUnix(a.Address)
	}
	return net.Listen("tcp", a.Address)
}

// listenUnix listens on a unix socket at path, mode 0600, replacing a
// stale socket there (never another kind of file).
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// tryLock takes the broker lock of dir without waiting; ok is false when
// a broker holds it.
func tryLock(dir string) (unlock func(), ok bool, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("broker: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("broker lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("broker lock: %w", err)
	}
	return func() { f.Close() }, true, nil
}

// Harden keeps the broker's memory, which holds values, from other
// processes of its user and from core files: no core dumps, and not
// dumpable (so no ptrace and no /proc/PID/mem by the same user). It is
// for the broker's own process (vmfork broker), not a library's caller.
func Harden() error {
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("broker: no core dumps: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("broker: not dumpable: %w", err)
	}
	return nil
}
