package qemustate

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/qmp"
)

// A device-state file without RAM, and without a migration. The migration
// stream of SaveDeviceState costs more of a pause than its few hundred KB
// suggest (measured on the test guest, 512 MiB, TCG: stop + save + cont 7.5-20
// ms, against 5-7.5 ms for the way below): QEMU starts its migration thread,
// the caller polls for the end, the stream carries the RAM blocks that are not
// shared (firmware and option ROMs, ~0.5 MB here), and at its end QEMU
// inactivates every block node, so that cont has to activate them again:
// qcow2 drops its caches and rereads its metadata, for every layer of the
// disk's chain.
//
// xen-save-devices-state (a QMP command of every QEMU target since 2.x, made
// for Xen, whose toolstack saves RAM itself) writes the same device sections
// from the QMP call itself, with no RAM block at all, and with live=false
// leaves the block nodes alone. Its stream has no configuration section and
// records the run state as running, so the QEMU that loads it is started with
// DevicesOnlyArgs. It opens a path; the path given is an fd set of vmfork's
// (add-fd), so QEMU still opens nothing by name.

// DevicesOnlyArgs are the QEMU arguments a QEMU started with -incoming defer
// needs to load a file of SaveDevices: the stream has no configuration
// section, and -S keeps the loaded VM paused although the stream says
// "running" (the loader resumes it).
var DevicesOnlyArgs = []string{"-global", "migration.send-configuration=off", "-S"}

// NonRAMBlocks returns the RAM blocks of QEMU that a file of SaveDevices
// would lose: every block but the one named shared (the guest's RAM, which
// the caller keeps elsewhere) and the firmware's and option ROMs' blocks,
// which a QEMU started with the same configuration builds with the same
// contents. A guest-writable block (a display's video RAM, a device's
// memory) is returned: its contents are only in a migration stream.
func NonRAMBlocks(ctx context.Context, ex qmp.Executor, shared string) ([]string, error) {
	var out string
	if err := ex.Execute(ctx, "human-monitor-command", map[string]string{"command-line": "info ramblock"}, &out); err != nil {
		return nil, fmt.Errorf("list RAM blocks: %w", err)
	}
	names, err := parseRAMBlocks(out)
	if err != nil {
		return nil, err
	}
	var keep []string
	for _, n := range names {
		rom := n == "pc.bios" || n == "pc.rom" || strings.HasPrefix(n, "/rom@") || strings.HasSuffix(n, ".rom")
		if n != shared && !rom {
			keep = append(keep, n)
		}
	}
	return keep, nil
}

// BlockOf returns the block of blocks (from NonRAMBlocks) that holds the
// memory of the object called id: "id" for a backend of its own, or
// "<device path>/id" as a device's block is named; "" when none does. A
// deleted backend's block stays listed until QEMU frees it, after an RCU
// grace period, and the detach steps of both drivers wait for that.
func BlockOf(blocks []string, id string) string {
	for _, b := range blocks {
		if b == id || strings.HasSuffix(b, "/"+id) {
			return b
		}
	}
	return ""
}

// ramBlockLine is a block's line in HMP's "info ramblock": its name (empty
// for a block whose owner is gone), then its page size and offset.
var ramBlockLine = regexp.MustCompile(`^\s*(.*?)\s*\b\d+ [KMGT]?i?B\s+0x[0-9a-f]+`)

// unnamedBlock stands for a RAM block listed without a name.
const unnamedBlock = "(unnamed)"

// parseRAMBlocks reads the block names of HMP's "info ramblock": a header
// line, then one line per block.
func parseRAMBlocks(out string) ([]string, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 || !strings.Contains(lines[0], "Block Name") {
		return nil, fmt.Errorf("list RAM blocks: unexpected output %q", firstLine(out))
	}
	var names []string
	for _, l := range lines[1:] {
		if strings.TrimSpace(l) == "" {
			continue
		}
		m := ramBlockLine.FindStringSubmatch(l)
		switch {
		case m == nil:
			return nil, fmt.Errorf("list RAM blocks: unexpected line %q", l)
		case m[1] == "":
			names = append(names, unnamedBlock)
		default:
			names = append(names, m[1])
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("list RAM blocks: none listed")
	}
	return names, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// CreateDevicesFile creates the file at path, which must not exist yet, and
// hands it to QEMU in an fd set, for SaveDevices with the returned name.
// Done before the VM pauses, as CreateSaveFile. release removes the fd set;
// call it once the save is over or did not happen.
func CreateDevicesFile(ctx context.Context, ex qmp.Executor, path string) (name string, release func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", nil, fmt.Errorf("create device-state file: %w", err)
	}
	defer f.Close()
	var fds struct {
		FDSet int `json:"fdset-id"`
	}
	if err := ex.ExecuteWithFile(ctx, "add-fd", map[string]any{}, f, &fds); err != nil {
		os.Remove(path)
		return "", nil, fmt.Errorf("pass device-state file: %w", err)
	}
	return fmt.Sprintf("/dev/fdset/%d", fds.FDSet), func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		ex.Execute(cctx, "remove-fd", map[string]any{"fdset-id": fds.FDSet}, nil)
	}, nil
}

// SaveDevices writes the paused VM's device state, without RAM, into the
// file CreateDevicesFile passed as name. It returns when the file is
// complete; the VM stays paused and its block nodes active.
func SaveDevices(ctx context.Context, ex qmp.Executor, name string) error {
	if err := ex.Execute(ctx, "xen-save-devices-state", map[string]any{"filename": name, "live": false}, nil); err != nil {
		return fmt.Errorf("save device state: %w", err)
	}
	return nil
}

// DeviceStateSave is a device-state save readied before the pause
// (PrepareDeviceState).
type DeviceStateSave struct {
	// DevicesOnly says Save writes the device sections alone (SaveDevices).
	// Otherwise it writes a migration stream, whose end QEMU reports a
	// moment before it leaves finish-migrate: the caller waits for that
	// before it resumes the VM.
	DevicesOnly bool
	// Save writes the file; the VM must be paused.
	Save func(ctx context.Context) error
	// Release lets QEMU's copy of the file go; call it once the save is
	// over or did not happen.
	Release func()
}

// PrepareDeviceState creates the device-state file at path, which must not
// exist yet, and readies its save, the same way on every driver: the device
// sections alone when ramInFile (the guest's memory is kept in a file of its
// own: QEMU's RAM block ramBlock is share=on and the freeze freezes its file)
// and QEMU has no other RAM block but ROMs (NonRAMBlocks); otherwise a
// migration stream with x-ignore-shared, through the descriptor name fdName,
// polled every poll. A failed look at the RAM blocks is not an error: the
// migration stream is right for any guest. log, when not nil, gets at debug
// level why it chose a migration stream, and the save's state changes.
func PrepareDeviceState(ctx context.Context, ex qmp.Executor, path, fdName, ramBlock string, ramInFile bool, poll time.Duration, log *logrus.Entry) (*DeviceStateSave, error) {
	if ramInFile {
		blocks, err := NonRAMBlocks(ctx, ex, ramBlock)
		if err == nil && len(blocks) == 0 {
			name, release, err := CreateDevicesFile(ctx, ex, path)
			if err != nil {
				return nil, err
			}
			return &DeviceStateSave{
				DevicesOnly: true, Release: release,
				Save: func(ctx context.Context) error { return SaveDevices(ctx, ex, name) },
			}, nil
		}
		orDiscard(log).WithError(err).WithField("ram_blocks", blocks).Debug("device state saved as a migration stream: RAM outside the guest's memory file")
	}
	release, err := CreateSaveFile(ctx, ex, fdName, path)
	if err != nil {
		return nil, err
	}
	return &DeviceStateSave{
		Release: release,
		Save:    func(ctx context.Context) error { return SaveDeviceState(ctx, ex, fdName, poll, log) },
	}, nil
}
