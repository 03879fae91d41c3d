package customize

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// hostAgent runs the steps' commands on the host, with a real shell, for
// tests of what the scripts do. sh is the shell /bin/sh stands for (dash,
// or busybox sh); root is the fake guest's file tree (the scripts' $R) and
// bin a directory of stub commands put first on PATH. Nothing else of the
// agent is there.
type hostAgent struct {
	t    *testing.T
	sh   []string
	root string

	ifaces []qmp.NetworkInterface

	mu     sync.Mutex
	status []qmp.ExecStatus
}

func (h *hostAgent) Ping(context.Context) error { return nil }

func (h *hostAgent) Exec(ctx context.Context, req qmp.ExecRequest) (int, error) {
	path, args := req.Path, req.Args
	if path == "/bin/sh" {
		path, args = h.sh[0], append(append([]string(nil), h.sh[1:]...), args...)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = req.Env
	cmd.Stdin = bytes.NewReader(req.Input)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	st := qmp.ExecStatus{Exited: true, Stdout: o.Bytes(), Stderr: e.Bytes()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		st.ExitCode = ee.ExitCode()
	} else if err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.status = append(h.status, st)
	return len(h.status), nil
}

func (h *hostAgent) ExecStatus(_ context.Context, pid int) (qmp.ExecStatus, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.status[pid-1], nil
}

func (h *hostAgent) GetTime(context.Context) (time.Time, error) { return time.Now(), nil }
func (h *hostAgent) SetTime(context.Context, *time.Time) error  { return errors.New("not on the host") }
func (h *hostAgent) WriteFile(_ context.Context, path string, data []byte) error {
	return os.WriteFile(h.root+path, data, 0o600)
}
func (h *hostAgent) ReadFile(_ context.Context, path string) ([]byte, error) {
	return os.ReadFile(h.root + path)
}
func (h *hostAgent) NetworkInterfaces(context.Context) ([]qmp.NetworkInterface, error) {
	return h.ifaces, nil
}
