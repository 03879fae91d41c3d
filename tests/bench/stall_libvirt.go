//go:build cgo

package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/vmfork/vmfork/profile"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/sharedmem"
)

// pauseFloorLibvirt is the floor of a fork on the libvirt driver: the same
// calls its freeze makes with nothing else, on the source's own domain:
// virDomainSuspend, a device-state save with x-ignore-shared through
// libvirt's QMP passthrough (libvirt owns the monitor), the wait for QEMU
// to leave finish-migrate, virDomainResume. Timed from the suspend until
// the resume returned, as pauseFloor times the embedded driver's.
func (e *Env) pauseFloorLibvirt(ctx context.Context, name string) (float64, error) {
	conn, err := libvirt.NewConnect(e.cfg.LibvirtURI)
	if err != nil {
		return 0, fmt.Errorf("pause floor of %s: connect to %s: %w", name, e.cfg.LibvirtURI, err)
	}
	defer conn.Close()
	dom, err := conn.LookupDomainByName(name)
	if err != nil {
		return 0, fmt.Errorf("pause floor of %s: %w", name, err)
	}
	defer dom.Free()
	mon := lvMonitor{dom}
	if err := qemustate.PrepareSave(ctx, mon); err != nil {
		return 0, fmt.Errorf("pause floor of %s: %w", name, err)
	}
	scratch := filepath.Join(e.dir, name+".floor.devstate")
	defer os.Remove(scratch)
	// The save the driver's freeze makes (qemustate.PrepareDeviceState).
	shared, err := sharedmem.QOMShare(ctx, mon, profile.RAMBlock)
	if err != nil {
		return 0, fmt.Errorf("pause floor of %s: %w", name, err)
	}
	prep, err := qemustate.PrepareDeviceState(ctx, mon, scratch, "floor", profile.RAMBlock, shared, 2*time.Millisecond, nil)
	if err != nil {
		return 0, fmt.Errorf("pause floor of %s: %w", name, err)
	}
	save := func(ctx context.Context) error {
		if err := prep.Save(ctx); err != nil || prep.DevicesOnly {
			return err
		}
		return lvSettled(context.WithoutCancel(ctx), mon)
	}
	defer prep.Release()
	start := time.Now()
	if err := dom.Suspend(); err != nil {
		return 0, fmt.Errorf("pause floor of %s: virDomainSuspend: %w", name, err)
	}
	serr := save(ctx)
	if err := dom.Resume(); err != nil {
		return 0, fmt.Errorf("pause floor of %s: virDomainResume: %w (it may still be paused)", name, err)
	}
	d := time.Since(start)
	if serr != nil {
		return 0, fmt.Errorf("pause floor of %s: %w", name, serr)
	}
	return ms(d), nil
}

// lvSettled waits for QEMU to leave finish-migrate: a resume in it fails
// ("Migration is not finalized yet"), and the driver's freeze waits too.
func lvSettled(ctx context.Context, mon lvMonitor) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		var st struct {
			Status string `json:"status"`
		}
		if err := mon.Execute(ctx, "query-status", nil, &st); err != nil {
			return err
		}
		if st.Status != "finish-migrate" {
			return nil
		}
		if err := sleepCtx(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("QEMU still finishing the save: %w", err)
		}
	}
}

// lvMonitor is QMP through libvirt's passthrough, as the libvirt driver's
// own monitor (libvirtdrv/monitor.go), for the floor only.
type lvMonitor struct{ dom *libvirt.Domain }

var _ qmp.Executor = lvMonitor{}

func (m lvMonitor) Execute(ctx context.Context, cmd string, args, result any) error {
	return m.command(cmd, args, nil, result)
}

func (m lvMonitor) ExecuteWithFile(ctx context.Context, cmd string, args any, f *os.File, result any) error {
	if f == nil {
		return fmt.Errorf("qmp: %s: no file to pass", cmd)
	}
	return m.command(cmd, args, f, result)
}

func (m lvMonitor) command(cmd string, args any, f *os.File, result any) error {
	req, err := qmp.EncodeCommand(cmd, args)
	if err != nil {
		return err
	}
	var reply string
	if f == nil {
		reply, err = m.dom.QemuMonitorCommand(string(req), libvirt.DOMAIN_QEMU_MONITOR_COMMAND_DEFAULT)
	} else {
		reply, _, err = m.dom.QemuMonitorCommandWithFiles(string(req), []os.File{*f}, libvirt.DOMAIN_QEMU_MONITOR_COMMAND_DEFAULT)
	}
	if err != nil {
		return fmt.Errorf("qmp: %s: %w", cmd, err)
	}
	return qmp.DecodeReply(cmd, []byte(reply), result)
}
