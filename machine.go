package vmfork

import (
	"errors"
	"fmt"
	"github.com/vmfork/vmfork/contract"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmfork/vmfork/profile"
)

// State is a machine's lifecycle state as recorded in the store.
type State string

// Machine states.
const (
	StateCreating State = "creating" // record made, process not yet confirmed
	StateRunning  State = "running"
	StatePaused   State = "paused" // QEMU is up but the guest does not run
	StateStopped  State = "stopped"
	// StatePooled is a warm-pool process of a kept template (pool.go): QEMU
	// started and waiting for a fork to load the device state.
	StatePooled State = "pooled"
	// StateHibernated is a machine frozen into a template of its own with
	// its QEMU ended and its RAM on disk (hibernate.go); resume continues it.
	StateHibernated State = "hibernated"
)

// PortForward forwards a host TCP port to a guest TCP port through QEMU's
// user-mode network.
type PortForward struct {
	Host  int `json:"host"`
	Guest int `json:"guest"`
}

func (p PortForward) String() string { return fmt.Sprintf("%d:%d", p.Host, p.Guest) }

// ParsePortForward parses "HOST:GUEST", or "GUEST" for a host port picked at
// start time (Host is then 0).
func ParsePortForward(s string) (PortForward, error) {
	var p PortForward
	host, guest, ok := strings.Cut(s, ":")
	if !ok {
		host, guest = "0", s
	}
	var err error
	if p.Host, err = parsePort(host, true); err != nil {
		return p, fmt.Errorf("port forward %q: host %w", s, err)
	}
	if p.Guest, err = parsePort(guest, false); err != nil {
		return p, fmt.Errorf("port forward %q: guest %w", s, err)
	}
	return p, nil
}

func parsePort(s string, zeroOK bool) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 65535 || (n == 0 && !zeroOK) {
		return 0, fmt.Errorf("port %q must be a number from 1 to 65535: %w", s, ErrInvalid)
	}
	return n, nil
}

// ParseMemory parses a memory size such as "512M", "2G" or "512" (MiB) into
// MiB.
func ParseMemory(s string) (int, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := 1
	switch {
	case strings.HasSuffix(t, "G"):
		mult, t = 1024, strings.TrimSuffix(t, "G")
	case strings.HasSuffix(t, "M"):
		t = strings.TrimSuffix(t, "M")
	}
	n, err := strconv.Atoi(t)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("memory size %q: want a size such as 512M or 2G: %w", s, ErrInvalid)
	}
	if n > MaxMemoryMiB/mult {
		return 0, fmt.Errorf("memory size %q: more than %d TiB: %w", s, MaxMemoryMiB>>20, ErrInvalid)
	}
	return n * mult, nil
}

// Spec is what a machine is made of. Everything in it except Ports and the
// network's name is part of the guest-visible configuration that a fork
// child must reproduce exactly (the kind of network too: a tap offers the
// NIC offloads the user network does not), so
// drivers fill in the fields they resolve (machine type, CPU model, MAC) when
// a machine first starts, and children copy them.
type Spec struct {
	Kernel string `json:"kernel,omitempty"`
	Initrd string `json:"initrd,omitempty"`
	Append string `json:"append,omitempty"`
	// Disk is the base image. It is never written: the machine writes to a
	// qcow2 overlay on it in its own directory.
	Disk string `json:"disk,omitempty"`
	// DiskID is the boot disk's id (--disk id=ID,file=...), "" for
	// BootDiskID; Disks are the extra disks after it, each with its fork
	// policy (disks.go). A record without them has the one disk it always
	// had.
	DiskID    string        `json:"disk_id,omitempty"`
	Disks     []DiskSpec    `json:"disks,omitempty"`
	MemoryMiB int           `json:"memory_mib"`
	CPUs      int           `json:"cpus"`
	Ports     []PortForward `json:"ports,omitempty"`
	// Network is what the NIC is plugged into on the host; the zero value
	// is the user network. Children inherit it (network.go).
	Network Network `json:"network"`
	// Devices and Objects are extra QEMU devices (boot --device) and the
	// backends they need (boot --object); children get the objects and the
	// devices still plugged in (device.go).
	Devices []Device `json:"devices,omitempty"`
	Objects []string `json:"objects,omitempty"`

	// Resolved by the driver at first start.
	MachineType string `json:"machine_type,omitempty"` // versioned, e.g. pc-q35-7.2
	CPUModel    string `json:"cpu_model,omitempty"`
	MAC         string `json:"mac,omitempty"`

	// LedgerPort gives the machine the family ledger's virtio-serial port
	// (profile.LedgerChannel, served on Paths.Ledger). Set at boot; a child
	// copies it with the rest of its source's spec, so a template made
	// before vmfork had the port keeps children without it: their device
	// state has no such port to load.
	LedgerPort bool `json:"ledger_port,omitempty"`
}

// FillProfile sets what a spec leaves open and does not depend on the
// driver: the CPU model, a MAC, and free host ports for the forwards that
// left theirs to vmfork. Both drivers call it once the machine type is known.
func (s *Spec) FillProfile() error {
	if s.CPUModel == "" {
		s.CPUModel = profile.DefaultCPUModel
	}
	if s.MAC == "" {
		s.MAC = profile.RandomMAC()
	}
	return PickPorts(s.Ports)
}

// PickPorts checks that requested host ports are free and picks free ones
// for forwards that left the host port to vmfork (Host == 0).
func PickPorts(ports []PortForward) (err error) {
	for i := range ports {
		if ports[i].Host, err = profile.FreePort(ports[i].Host); err != nil {
			return fmt.Errorf("%w: %w", err, ErrInvalid)
		}
	}
	return nil
}

// Limits on a Spec.
const (
	MinMemoryMiB = 64
	// MaxMemoryMiB bounds a parsed size (16 TiB, QEMU's x86 limit is
	// higher) so that no size overflows; the host's own memory is checked
	// in Validate.
	MaxMemoryMiB = 16 << 20
	MaxCPUs      = 64
)

// Validate checks a spec before anything is created, so that bad input changes
// nothing. Files must exist and be readable.
func (s *Spec) Validate() error {
	if s.Kernel == "" && s.Disk == "" {
		return fmt.Errorf("a kernel (--kernel) or a disk image (--disk) is required: %w", ErrInvalid)
	}
	if s.Kernel == "" && (s.Initrd != "" || s.Append != "") {
		return fmt.Errorf("--initrd and --append need --kernel: %w", ErrInvalid)
	}
	for _, f := range []struct{ what, path string }{{"kernel", s.Kernel}, {"initrd", s.Initrd}, {"disk image", s.Disk}} {
		if f.path == "" {
			continue
		}
		if f.what == "disk image" {
			if err := refuseNetworkDisk("disk image", f.path); err != nil {
				return err
			}
			if err := checkBootDiskNotBlock(f.path); err != nil {
				return err
			}
		}
		if !filepath.IsAbs(f.path) {
			return fmt.Errorf("%s path %q must be absolute: %w", f.what, f.path, ErrInvalid)
		}
		st, err := os.Stat(f.path)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s %q does not exist: %w", f.what, f.path, ErrInvalid)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", f.what, asInvalid(err))
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%s %q is not a regular file: %w", f.what, f.path, ErrInvalid)
		}
	}
	if s.MemoryMiB < MinMemoryMiB {
		return fmt.Errorf("memory %d MiB is below the minimum of %d MiB: %w", s.MemoryMiB, MinMemoryMiB, ErrInvalid)
	}
	if s.CPUs < 1 || s.CPUs > MaxCPUs {
		return fmt.Errorf("cpus %d must be from 1 to %d: %w", s.CPUs, MaxCPUs, ErrInvalid)
	}
	if err := s.validateOnHost(); err != nil {
		return err
	}
	if err := s.validateNetwork(); err != nil {
		return err
	}
	if err := s.validateDevices(); err != nil {
		return err
	}
	if err := s.validateDisks(); err != nil {
		return err
	}
	if n := s.Network.Effective(); n.Kind == NetworkBridge {
		if err := CheckBridge(n.Name); err != nil {
			return err
		}
	}
	seen := map[int]bool{}
	for _, p := range s.Ports {
		if p.Host != 0 && seen[p.Host] {
			return fmt.Errorf("host port %d is forwarded twice: %w", p.Host, ErrInvalid)
		}
		seen[p.Host] = true
	}
	return nil
}

// Paths are a machine's files. The store chooses them; drivers use them.
type Paths struct {
	Dir  string `json:"dir"`
	Disk string `json:"disk"`
	// Disks are the images of the extra disks (Spec.Disks) by id, set
	// when the machine first starts or is made by a fork.
	Disks  map[string]DiskFile `json:"disks,omitempty"`
	QMP    string              `json:"qmp_socket"`
	QGA    string              `json:"qga_socket"`
	Serial string              `json:"serial_log"`
	Log    string              `json:"qemu_log"`
	// Ledger is the unix socket QEMU listens on for the family ledger's
	// port (Spec.LedgerPort); the ledger server connects to it.
	Ledger string `json:"ledger_socket,omitempty"`
	// RAM is the guest RAM file. A booted machine owns it (mapped share=on);
	// a fork child maps its template's frozen file share=off and owns none.
	RAM       string `json:"ram_file"`
	RAMShared bool   `json:"ram_shared"`
}

// Machine is a machine's record, kept in <state-dir>/machines/<name>/machine.json.
type Machine struct {
	Name   string `json:"name"`
	Driver string `json:"driver"`
	State  State  `json:"state"`
	PID    int    `json:"pid,omitempty"`
	Accel  string `json:"accel,omitempty"`
	// VMGenID is the vmgenid GUID to start with; empty means a fresh one
	// (guid=auto). Fork children with a reproducible identity reuse their
	// template's.
	VMGenID string `json:"vmgenid,omitempty"`
	// GuestMAC is the MAC a fork child's identity chain gives the guest.
	// Spec.MAC stays the template's, the MAC the guest wakes with (it
	// travels in the device state); a driver configures the child's NIC with
	// GuestMAC, so a reset keeps it, and QEMU's receive filter follows the
	// guest's choice.
	GuestMAC string `json:"guest_mac,omitempty"`
	// Identity is what the identity chain did in a fork child.
	Identity *IdentityResult `json:"identity,omitempty"`
	Spec     Spec            `json:"spec"`
	Paths    Paths           `json:"paths"`
	Parent   string          `json:"parent,omitempty"`
	Template string          `json:"template,omitempty"`
	Created  time.Time       `json:"created"`
	// Expires is the machine's deadline (--ttl), zero for none: the reaper
	// (ttl.go) removes the machine once it has passed, with no vmfork
	// command running.
	Expires time.Time `json:"expires,omitzero"`
	// Hibernated is the template that holds a hibernated machine's
	// instant (hibernate.go). It is set from just before the freeze of a
	// hibernate until a resume has finished, which keeps the template from
	// being collected meanwhile.
	Hibernated string `json:"hibernated,omitempty"`
	// Adopted is set on a machine vmfork did not make but took charge of to
	// fork it (adopt.go); nil for machines vmfork booted or forked.
	Adopted *Adoption `json:"adopted,omitempty"`
	// Contract is what the machine may reach and hold, enforced by the
	// host (contracts.go); nil for none. Its children inherit it unless
	// their fork names another.
	Contract *contract.Contract `json:"contract,omitempty"`
	// Broker is how its brokered secrets are served (brokered.go): the
	// placeholders its guest holds and where its proxy is; nil without
	// secrets.
	Broker *BrokerState `json:"broker,omitempty"`
	// Family names the root machine this one was made from, and so
	// everything made from that root (family.go): fork children, forks of
	// forks, kept templates and their children, rewinds, explore branches.
	Family string `json:"family,omitempty"`
	// StopReason says why a stopped machine is stopped (stopreason.go):
	// recorded when vmfork stops it, derived when its QEMU ended on its
	// own; empty while it runs.
	StopReason StopReason `json:"stop_reason,omitempty"`
	// HostBoot is the host's boot id when the record was last saved with
	// the machine running: a machine found stopped under another boot id
	// was stopped by the host's restart.
	HostBoot string `json:"host_boot,omitempty"`
}

// mapsTemplate reports whether m's QEMU maps its template's RAM (share=off):
// a fork child, a resumed or rewound machine that runs. A started one has
// its own RAM file (start.go) and needs only the template's disk.
func (m *Machine) mapsTemplate() bool {
	return m.Template != "" && !m.Paths.RAMShared && m.State != StateStopped && m.State != StateHibernated
}

// Adoption is what vmfork keeps of a machine it adopted, such as a libvirt
// domain an operator defined. The machine stays its owner's: vmfork rm only
// forgets it, and vmfork never writes or removes its files.
type Adoption struct {
	// ID is the driver's own identifier of the machine (a libvirt domain
	// UUID), so that another machine given the same name later is not
	// mistaken for it.
	ID string `json:"id"`
	// Disk is the machine's own disk image at adoption. The first fork
	// freezes it in place for the children and moves the machine onto an
	// overlay in its directory; vmfork never writes it.
	Disk string `json:"disk,omitempty"`
}
