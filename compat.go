package vmfork

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
)

// A template restores only where its manifest fits: the QEMU that loads
// its device state must be the same version, with the same machine type,
// CPU model and guest-visible devices, or the load fails half-way (or,
// worse, succeeds with a device that behaves differently). The drivers
// check this again when a child's QEMU is up; CheckTemplate checks it
// before anything is started, so that a template copied from another host
// (import.go) or left behind by an upgrade is refused naming the field.

// HostFacts are what an exported template records of the host it was made
// on, beyond the manifest: with the host's own CPU model ("-cpu host") the
// guest sees the host's CPU flags, and a host without one of them cannot
// run it.
type HostFacts struct {
	CPUFlags []string `json:"cpu_flags,omitempty"`
}

// hostCPUModel is the CPU model that passes the host's CPU to the guest.
const hostCPUModel = "host"

// needsHostFlags reports whether t's guest sees the host CPU's flags.
func needsHostFlags(t *Template) bool { return t.Spec.CPUModel == hostCPUModel }

// cpuFlagsFile is where the host's CPU flags are read.
var cpuFlagsFile = "/proc/cpuinfo"

// hostCPUFlags returns the flags of this host's first CPU, sorted.
func hostCPUFlags() ([]string, error) {
	data, err := os.ReadFile(cpuFlagsFile)
	if err != nil {
		return nil, fmt.Errorf("read host CPU flags: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "flags" {
			flags := strings.Fields(v)
			slices.Sort(flags)
			return flags, nil
		}
	}
	return nil, fmt.Errorf("read host CPU flags: no flags line in %s", cpuFlagsFile)
}

// hostFacts describes this host for template t's export.
func hostFacts(t *Template) (HostFacts, error) {
	if !needsHostFlags(t) {
		return HostFacts{}, nil
	}
	flags, err := hostCPUFlags()
	return HostFacts{CPUFlags: flags}, err
}

// checkHostFacts refuses a host that lacks a CPU flag the template's guest
// saw where it was made.
func checkHostFacts(t *Template, made HostFacts) error {
	if !needsHostFlags(t) || len(made.CPUFlags) == 0 {
		return nil
	}
	have, err := hostCPUFlags()
	if err != nil {
		return err
	}
	var missing []string
	for _, f := range made.CPUFlags {
		if _, found := slices.BinarySearch(have, f); !found {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("template needs CPU flags %q, this host lacks them: %w", strings.Join(missing, " "), ErrUnsupported)
	}
	return nil
}

// CheckTemplate refuses template t, before anything is started, when it
// does not fit this host or this manager's driver; the error names the
// field and both values, and wraps ErrUnsupported.
func (mg *Manager) CheckTemplate(ctx context.Context, t *Template) error {
	if t.Driver != mg.Driver.Name() {
		return fmt.Errorf("template %s needs driver %q, this host runs %q: %w", t.ID, t.Driver, mg.Driver.Name(), ErrUnsupported)
	}
	if !t.HasMemory {
		return nil // a disk-only template boots fresh: nothing to load
	}
	hc, ok := mg.Driver.(HostChecker)
	if !ok {
		return nil // the driver checks when the child's QEMU is up
	}
	got, err := hc.HostManifest(ctx, t)
	if err != nil {
		return fmt.Errorf("template %s: describe this host: %w", t.ID, err)
	}
	got.DevStateBytes, got.RAMSharedWithChildren = t.Manifest.DevStateBytes, t.Manifest.RAMSharedWithChildren
	if err := got.Check(t.Manifest); err != nil {
		return fmt.Errorf("template %s: %w", t.ID, err)
	}
	return nil
}
