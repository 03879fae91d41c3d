package libvirtdrv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmfork/vmfork/internal/proc"
)

// Daemon reloads and restarts the libvirt daemon for Setup.
type Daemon interface {
	// Reload makes libvirtd rescan its hooks (SIGHUP).
	Reload(ctx context.Context) error
	// Restart restarts libvirtd, which rereads qemu.conf. Running domains
	// keep running: libvirtd reconnects to their QEMU processes.
	Restart(ctx context.Context) error
}

// SystemDaemon is the monolithic libvirtd of a Debian 12 host: through
// systemctl when systemd runs, else through its pid file, started again the
// way scripts/libvirtd.sh starts it (libvirtd -d).
type SystemDaemon struct{}

const (
	libvirtdPidFile = "/run/libvirtd.pid"
	libvirtdSocket  = "/run/libvirt/libvirt-sock"
	daemonWait      = 30 * time.Second
)

func systemd() bool {
	st, err := os.Stat("/run/systemd/system")
	return err == nil && st.IsDir()
}

// Reload implements Daemon.
func (SystemDaemon) Reload(ctx context.Context) error {
	if systemd() {
		return run(ctx, "systemctl", "reload", "libvirtd.service")
	}
	pid, err := libvirtdPID()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("signal libvirtd (pid %d): %w", pid, err)
	}
	return nil
}

// Restart implements Daemon.
func (SystemDaemon) Restart(ctx context.Context) error {
	if systemd() {
		return run(ctx, "systemctl", "restart", "libvirtd.service")
	}
	if pid, err := libvirtdPID(); err == nil {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("stop libvirtd (pid %d): %w", pid, err)
		}
		if err := poll(ctx, func() bool { return !proc.Running(pid) }); err != nil {
			return fmt.Errorf("libvirtd (pid %d) did not exit: %w", pid, err)
		}
	}
	// No pipes: the daemon keeps its inherited descriptors, and a pipe held
	// open by it would keep this wait going. Its own session, so a Ctrl-C
	// in this terminal never reaches it.
	// umask 022: libvirtd creates its directories (memory_backing_dir's
	// libvirt/, say) under the umask it inherits, and vmfork's own (077)
	// would leave them closed to the QEMU user libvirt runs domains as,
	// which then cannot open its RAM file. A fixed command line, no input.
	cmd := exec.Command("/bin/sh", "-c", "umask 022 && exec libvirtd -d")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("failed to run %v: %w", cmd.Args, err)
	}
	return poll(ctx, func() bool {
		c, err := net.Dial("unix", libvirtdSocket)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func libvirtdPID() (int, error) {
	data, err := os.ReadFile(libvirtdPidFile)
	if err != nil {
		return 0, fmt.Errorf("find libvirtd: %w (is it running?)", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("find libvirtd: bad pid in %s: %q", libvirtdPidFile, data)
	}
	return pid, nil
}

// poll waits until ok returns true, for at most daemonWait.
func poll(ctx context.Context, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, daemonWait)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !ok() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("failed to run %v: stderr=%#q: %w", cmd.Args, strings.TrimSpace(stderr.String()), err)
	}
	return nil
}
