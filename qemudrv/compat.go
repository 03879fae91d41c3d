package qemudrv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"sync"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qmp"
)

var _ vmfork.HostChecker = (*Driver)(nil)

// hostQEMU is what the QEMU binary at a path offers, asked once per process
// (three short runs of the binary).
type hostQEMU struct {
	version  string
	machines map[string]bool
	cpus     map[string]bool
}

var (
	hostMu    sync.Mutex
	hostCache = map[string]*hostQEMU{}
)

var versionPattern = regexp.MustCompile(`QEMU emulator version ([0-9]+)\.([0-9]+)\.([0-9]+)`)

func describeQEMU(ctx context.Context, bin string) (*hostQEMU, error) {
	hostMu.Lock()
	defer hostMu.Unlock()
	if h, ok := hostCache[bin]; ok {
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
	h := &hostQEMU{version: fmt.Sprintf("%s.%s.%s", m[1], m[2], m[3]), machines: map[string]bool{}, cpus: map[string]bool{}}
	if out, err = run("-machine", "help"); err != nil {
		return nil, err
	}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if f := strings.Fields(sc.Text()); len(f) > 1 && f[0] != "Supported" {
			h.machines[f[0]] = true
		}
	}
	if out, err = run("-cpu", "help"); err != nil {
		return nil, err
	}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if f := strings.Fields(sc.Text()); len(f) > 1 && f[0] == "x86" {
			h.cpus[f[1]] = true
		}
	}
	hostCache[bin] = h
	return h, nil
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	return string(line)
}

// HostManifest implements vmfork.HostChecker: the manifest a child of t
// would get from this host's QEMU, found without starting one. A machine
// type or CPU model this QEMU does not know comes back empty, so the
// template's check names it.
func (d *Driver) HostManifest(ctx context.Context, t *vmfork.Template) (vmfork.Manifest, error) {
	bin, err := qemuBinary()
	if err != nil {
		return vmfork.Manifest{}, err
	}
	h, err := describeQEMU(ctx, bin)
	if err != nil {
		return vmfork.Manifest{}, err
	}
	m := &vmfork.Machine{Name: "check", Driver: d.Name(), Accel: t.Accel, Spec: t.Spec, VMGenID: t.VMGenID}
	got := manifestOf(m, qmp.Greeting{})
	got.QEMUVersion = h.version
	if !h.machines[got.MachineType] {
		got.MachineType = ""
	}
	if !h.cpus[got.CPUModel] {
		got.CPUModel = ""
	}
	return got, nil
}
