package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/contract"
	"github.com/vmfork/vmfork/qemudrv"
)

var globalFlags = []cli.Flag{
	&cli.StringFlag{
		Name:    "state-dir",
		Usage:   "directory for machine records, disks, sockets and logs",
		Value:   vmfork.DefaultStateDir(),
		EnvVars: []string{"VMFORK_STATE_DIR"},
	},
	&cli.StringFlag{
		Name:    "mem-dir",
		Usage:   "directory for guest RAM files; must be a tmpfs (default /dev/shm/vmfork for root, /dev/shm/vmfork-UID for others)",
		Value:   vmfork.DefaultMemDir(),
		EnvVars: []string{"VMFORK_MEM_DIR"},
	},
	&cli.StringFlag{
		Name:    "connect",
		Aliases: []string{"c"},
		Usage:   "libvirt URI (e.g. qemu:///system): use the libvirt driver instead of the embedded QEMU driver",
		EnvVars: []string{"LIBVIRT_DEFAULT_URI"},
	},
	&cli.StringFlag{
		Name:    "qemu",
		Usage:   "QEMU binary the embedded driver runs (default: qemu-system-x86_64 on PATH)",
		EnvVars: []string{qemuEnv},
	},
	&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print errors only on stderr"},
	&cli.StringFlag{
		Name:    "log-level",
		Usage:   "debug, info, warn or error",
		Value:   "info",
		EnvVars: []string{"VMFORK_LOG_LEVEL"},
	},
	&cli.StringFlag{
		Name: "overcommit",
		Usage: "admission: the RAM new machines are estimated to take may be up to RATIO times what the host can give " +
			"(its available memory less a reserve); off: no check (default " + fmt.Sprint(vmfork.DefaultOvercommit) + ")",
		EnvVars: []string{"VMFORK_OVERCOMMIT"},
	},
	&cli.DurationFlag{
		Name:    "timeout",
		Usage:   "give up on the whole command after this long (0: no limit)",
		EnvVars: []string{"VMFORK_TIMEOUT"},
	},
}

var jsonFlag = &cli.BoolFlag{Name: "json", Usage: "print the result as JSON on stdout"}

func setupLogging(cliCtx *cli.Context) error {
	logrus.SetOutput(os.Stderr)
	logrus.SetFormatter(&logrus.TextFormatter{DisableTimestamp: true})
	level, err := logrus.ParseLevel(cliCtx.String("log-level"))
	if err != nil {
		return usageError{fmt.Errorf("--log-level: %w", err)}
	}
	if cliCtx.Bool("quiet") {
		level = logrus.ErrorLevel
	}
	logrus.SetLevel(level)
	if level >= logrus.DebugLevel {
		// Debug lines are for timelines (the agent's round trips, say).
		logrus.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05.000"})
	}
	if d := cliCtx.Duration("timeout"); d < 0 {
		return usageError{fmt.Errorf("--timeout %v: want a positive duration such as 90s or 10m (0 for none)", d)}
	}
	return nil
}

// appContext derives the command's context once, applying --timeout.
func appContext(cliCtx *cli.Context) (context.Context, context.CancelFunc) {
	if d := cliCtx.Duration("timeout"); d > 0 {
		return context.WithTimeout(cliCtx.Context, d)
	}
	return context.WithCancel(cliCtx.Context)
}

// newManager opens the store and wires the driver: libvirt with --connect,
// else the embedded QEMU driver.
func newManager(cliCtx *cli.Context) (*vmfork.Manager, error) {
	// Before the store: a bad --qemu changes nothing, not even the state dir.
	uri := cliCtx.String("connect")
	qemu, err := qemuOf(cliCtx)
	if err != nil {
		return nil, err
	}
	admission, err := vmfork.ParseOvercommit(cliCtx.String("overcommit"))
	if err != nil {
		return nil, usageError{fmt.Errorf("--%w", err)}
	}
	store, err := vmfork.OpenStore(cliCtx.String("state-dir"), cliCtx.String("mem-dir"))
	if err != nil {
		return nil, err
	}
	log := logrus.NewEntry(logrus.StandardLogger())
	qd := qemudrv.New(log)
	qd.QEMU = qemu
	var driver vmfork.Driver = qd
	if uri != "" {
		if newLibvirtDriver == nil {
			return nil, fmt.Errorf("--connect %s: this vmfork was built without libvirt support: %w", uri, vmfork.ErrUnsupported)
		}
		if driver, err = newLibvirtDriver(uri, log); err != nil {
			return nil, err
		}
	}
	mg := vmfork.NewManager(store, driver, log)
	mg.Admission = admission
	mg.Reaper = reaperStarter(cliCtx)
	mg.Broker = brokerClient(cliCtx)
	// Every machine's ledger port is served by `vmfork ledger-server`,
	// which the client starts when a machine starts and none runs.
	if mg.Ledger, err = ledgerClient(cliCtx); err != nil {
		return nil, err
	}
	return mg, nil
}

// qemuEnv is --qemu's environment variable.
const qemuEnv = "VMFORK_QEMU"

// qemuOf returns the QEMU binary --qemu (or VMFORK_QEMU) names, as an
// absolute path, for the embedded driver (qemudrv.Driver.QEMU) and the
// reaper it starts (reaperStarter); "" when neither is set. It checks the
// binary before the command does anything: a missing one would otherwise
// be found only once a record exists (boot) or the source is locked (fork).
func qemuOf(cliCtx *cli.Context) (string, error) {
	name := cliCtx.String("qemu")
	if cliCtx.String("connect") != "" {
		if cliCtx.IsSet("qemu") && os.Getenv(qemuEnv) == "" {
			return "", usageError{fmt.Errorf("--qemu is for the embedded driver: with --connect, libvirt runs the emulator its domain XML names")}
		}
		return "", nil
	}
	return resolveQEMU(name)
}

// resolveQEMU checks QEMU binary name (none: "") and returns its absolute
// path.
func resolveQEMU(name string) (string, error) {
	if name == "" {
		return "", nil
	}
	p, err := exec.LookPath(name)
	if err != nil {
		why := "is not an executable file"
		if fi, serr := os.Stat(name); errors.Is(serr, fs.ErrNotExist) || (serr != nil && !strings.Contains(name, "/")) {
			why = "does not exist"
		} else if serr == nil && fi.IsDir() {
			why = "is a directory"
		}
		return "", usageError{fmt.Errorf("QEMU binary %q (--qemu or %s) %s", name, qemuEnv, why)}
	}
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	return p, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// machineView is a machine as `ls` and `boot` print it. Its JSON form is a
// contract with scripts and the Ansible modules: change it only by adding.
type machineView struct {
	Name      string       `json:"name"`
	State     vmfork.State `json:"state"`
	Driver    string       `json:"driver"`
	PID       int          `json:"pid,omitempty"`
	MemoryMiB int          `json:"memory_mib"`
	CPUs      int          `json:"cpus"`
	Accel     string       `json:"accel,omitempty"`
	MAC       string       `json:"mac,omitempty"`
	// Hostname and Addresses are what a fork child's identity chain set.
	Hostname  string               `json:"hostname,omitempty"`
	Addresses []string             `json:"addresses,omitempty"`
	Ports     []vmfork.PortForward `json:"ports"`
	Network   vmfork.Network       `json:"network"`
	Parent    string               `json:"parent,omitempty"`
	Template  string               `json:"template,omitempty"`
	Adopted   bool                 `json:"adopted,omitempty"`
	QMP       string               `json:"qmp_socket"`
	QGA       string               `json:"qga_socket"`
	Serial    string               `json:"serial_log"`
	Disk      string               `json:"disk,omitempty"`
	// Disks are the extra disks' images by id (boot --disk id=...).
	Disks   map[string]vmfork.DiskFile `json:"disks,omitempty"`
	RAM     string                     `json:"ram_file"`
	Created time.Time                  `json:"created"`
	// Expires is the --ttl deadline; TTLLeftS what is left of it.
	Expires  time.Time `json:"expires,omitzero"`
	TTLLeftS float64   `json:"ttl_left_s,omitempty"`
	// Contract is the machine's fork contract (vmfork contract NAME).
	Contract *contract.Contract `json:"contract,omitempty"`
	// StopReason says why a stopped machine is stopped, when vmfork can
	// tell: user, qemu-died or host-restart (vmfork.StopReason).
	StopReason vmfork.StopReason `json:"stop_reason,omitempty"`
}

func viewOf(m *vmfork.Machine) machineView {
	v := machineView{
		Name: m.Name, State: m.State, Driver: m.Driver, PID: m.PID,
		MemoryMiB: m.Spec.MemoryMiB, CPUs: m.Spec.CPUs, Accel: m.Accel, MAC: m.Spec.MAC,
		Ports: m.Spec.Ports, Network: m.Spec.Network.Effective(), Parent: m.Parent, Template: m.Template,
		QMP: m.Paths.QMP, QGA: m.Paths.QGA, Serial: m.Paths.Serial, RAM: m.Paths.RAM,
		Created: m.Created, Expires: m.Expires, Contract: m.Contract,
	}
	if m.State == vmfork.StateStopped {
		v.StopReason = m.StopReason
	}
	v.TTLLeftS = vmfork.TTLLeft(m.Expires, time.Now()).Seconds()
	if v.Ports == nil {
		v.Ports = []vmfork.PortForward{}
	}
	if m.Spec.Disk != "" {
		v.Disk = m.Paths.Disk
	}
	v.Disks = m.Paths.Disks
	v.Adopted = m.Adopted != nil
	if m.GuestMAC != "" {
		v.MAC = m.GuestMAC // a fork child's own MAC, set inside its guest
	}
	if id := m.Identity; id != nil {
		v.Hostname, v.Addresses = id.Hostname, id.Addresses
	}
	return v
}
