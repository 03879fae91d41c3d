package qemudrv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qmp"
)

var _ vmfork.HostChecker = (*Driver)(nil)

// hostQEMU is what the QEMU binary at a path offers. Asking takes three
// short runs of the binary (over 100 ms on a loaded host), too much for
// every fork from a kept template: the answer is kept per process, and in
// the template's directory (hostCacheFile) for as long as the binary is the
// same file.
type hostQEMU struct {
	Binary   binaryID        `json:"binary"`
	Version  string          `json:"version"`
	Machines map[string]bool `json:"machines"`
	CPUs     map[string]bool `json:"cpus"`
}

// binaryID tells one QEMU binary from its replacement (an upgrade).
type binaryID struct {
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	MTime int64  `json:"mtime_ns"`
	Inode uint64 `json:"inode"`
}

func identify(bin string) (binaryID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(bin, &st); err != nil {
		return binaryID{}, fmt.Errorf("stat %s: %w", bin, err)
	}
	return binaryID{Path: bin, Size: st.Size, MTime: st.Mtim.Nano(), Inode: st.Ino}, nil
}

// hostCacheFile is the cached host description in a template's directory.
const hostCacheFile = ".qemu-host.json"

func loadHostCache(dir string, id binaryID) *hostQEMU {
	if dir == "" {
		return nil
	}
	var h hostQEMU
	data, err := os.ReadFile(filepath.Join(dir, hostCacheFile))
	if err != nil || json.Unmarshal(data, &h) != nil || h.Binary != id {
		return nil
	}
	return &h
}

func saveHostCache(dir string, h *hostQEMU) {
	data, err := json.Marshal(h)
	if err != nil || dir == "" {
		return
	}
	// A cache: a read-only state dir only costs time.
	_ = vmfork.WriteFileAtomic(filepath.Join(dir, hostCacheFile), data, 0o600)
}

var (
	hostMu    sync.Mutex
	hostCache = map[string]*hostQEMU{}
)

var versionPattern = regexp.MustCompile(`QEMU emulator version ([0-9]+)\.([0-9]+)\.([0-9]+)`)

func describeQEMU(ctx context.Context, bin, cacheDir string) (*hostQEMU, error) {
	hostMu.Lock()
	defer hostMu.Unlock()
	id, err := identify(bin)
	if err != nil {
		return nil, err
	}
	if h, ok := hostCache[bin]; ok && h.Binary == id {
		return h, nil
	}
	if h := loadHostCache(cacheDir, id); h != nil {
		hostCache[bin] = h
		return h, nil
	}
	run := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, bin, args...)
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("failed to run %v: %w%s", cmd.Args, err, stderrOf(err))
		}
		return out, nil
	}
	out, err := run("--version")
	if err != nil {
		return nil, err
	}
	m := versionPattern.FindSubmatch(out)
	if m == nil {
		return nil, fmt.Errorf("%s --version: no version in %q", bin, firstLine(out))
	}
	// The same form as the QMP greeting's version (manifestOf).
	h := &hostQEMU{Binary: id, Version: fmt.Sprintf("%s.%s.%s", m[1], m[2], m[3]), Machines: map[string]bool{}, CPUs: map[string]bool{}}
	if out, err = run("-machine", "help"); err != nil {
		return nil, err
	}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if f := strings.Fields(sc.Text()); len(f) > 1 && f[0] != "Supported" {
			h.Machines[f[0]] = true
		}
	}
	if out, err = run("-cpu", "help"); err != nil {
		return nil, err
	}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if f := strings.Fields(sc.Text()); len(f) > 1 && f[0] == "x86" {
			h.CPUs[f[1]] = true
		}
	}
	hostCache[bin] = h
	saveHostCache(cacheDir, h)
	return h, nil
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	return string(line)
}

// HostManifest implements vmfork.HostChecker: the manifest a child of t
// would get from this host's QEMU, found without starting one. The answer
// is cached in t.Paths.Dir unless that is empty. A machine
// type or CPU model this QEMU does not know comes back empty, so the
// template's check names it.
func (d *Driver) HostManifest(ctx context.Context, t *vmfork.Template) (vmfork.Manifest, error) {
	bin, err := d.qemuBinary()
	if err != nil {
		return vmfork.Manifest{}, err
	}
	h, err := describeQEMU(ctx, bin, t.Paths.Dir)
	if err != nil {
		return vmfork.Manifest{}, err
	}
	m := &vmfork.Machine{Name: "check", Driver: d.Name(), Accel: t.Accel, Spec: t.Spec, VMGenID: t.VMGenID}
	got := manifestOf(m, qmp.Greeting{})
	got.QEMUVersion = h.Version
	if !h.Machines[got.MachineType] {
		got.MachineType = ""
	}
	if !h.CPUs[got.CPUModel] {
		got.CPUModel = ""
	}
	return got, nil
}
