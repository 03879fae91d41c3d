package qmp_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

func dialAgent(t *testing.T, script ...qmptest.Step) *qmp.Agent {
	t.Helper()
	sock := qmptest.NewAgentServer(t, script...)
	a, err := qmp.DialAgent(t.Context(), sock)
	if err != nil {
		t.Fatalf("DialAgent: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// Output left in the channel by an earlier client (stray 0xFF bytes, a stale sync reply, a stale
// command reply) must be skipped up to our own sync reply.
func TestAgentSyncSkipsStaleOutput(t *testing.T) {
	a := dialAgent(t,
		qmptest.Raw([]byte("\xff\xff{\"return\": 12345}\n{\"return\": {}}\n\xff{\"error\": {\"class\": \"GenericError\", \"desc\": \"x\"}}\n\xff")),
		qmptest.Expect("guest-get-host-name").WithArgs(nil).Return(map[string]string{"host-name": "web-1"}),
	)
	name, err := a.HostName(t.Context())
	if err != nil {
		t.Fatalf("HostName: %v", err)
	}
	if name != "web-1" {
		t.Errorf("host name: got %q, want %q", name, "web-1")
	}
}

func TestAgentRun(t *testing.T) {
	a := dialAgent(t,
		qmptest.Expect("guest-exec").WithArgs(map[string]any{
			"path":           "/bin/sh",
			"arg":            []string{"-c", "cat; echo oops >&2; exit 3"},
			"env":            []string{"LANG=C"},
			"input-data":     b64("hello\n"),
			"capture-output": true,
		}).Return(map[string]int{"pid": 42}),
		qmptest.Expect("guest-exec-status").WithArgs(map[string]int{"pid": 42}).Return(map[string]bool{"exited": false}),
		qmptest.Expect("guest-exec-status").WithArgs(map[string]int{"pid": 42}).Return(map[string]any{
			"exited": true, "exitcode": 3, "out-data": b64("hello\n"), "err-data": b64("oops\n"),
		}),
	)
	st, err := a.Run(t.Context(), qmp.ExecRequest{
		Path:          "/bin/sh",
		Args:          []string{"-c", "cat; echo oops >&2; exit 3"},
		Env:           []string{"LANG=C"},
		Input:         []byte("hello\n"),
		CaptureOutput: true,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := qmp.ExecStatus{Exited: true, ExitCode: 3, Stdout: []byte("hello\n"), Stderr: []byte("oops\n")}
	if st.Exited != want.Exited || st.ExitCode != want.ExitCode || st.Signal != 0 ||
		!bytes.Equal(st.Stdout, want.Stdout) || !bytes.Equal(st.Stderr, want.Stderr) {
		t.Errorf("status: got %+v, want %+v", st, want)
	}
}

func TestAgentExecError(t *testing.T) {
	const desc = "Failed to execute child process “/nope” (No such file or directory)"
	a := dialAgent(t, qmptest.Expect("guest-exec").Fail("GenericError", desc))
	_, err := a.Exec(t.Context(), qmp.ExecRequest{Path: "/nope"})
	var qerr *qmp.Error
	if !errors.As(err, &qerr) {
		t.Fatalf("Exec: got %v, want a *qmp.Error", err)
	}
	if qerr.Command != "guest-exec" || qerr.Class != qmp.ClassGenericError || qerr.Desc != desc {
		t.Errorf("error: got %+v, want guest-exec GenericError %q", *qerr, desc)
	}
	if !errors.Is(err, qmp.ErrGenericError) {
		t.Errorf("errors.Is(%v, ErrGenericError): got false, want true", err)
	}
}

// A command that times out leaves its reply in flight; the next command must resynchronize and
// not take that reply for its own. The fake sends the held-back ping reply just before the next
// sync reply, so without a resync HostName would decode the ping's {}.
func TestAgentTimeoutResyncs(t *testing.T) {
	a := dialAgent(t,
		qmptest.Expect("guest-ping").Late(),
		qmptest.Expect("guest-get-host-name").Return(map[string]string{"host-name": "web-1"}),
	)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := a.Ping(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ping: got %v, want context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("Ping returned after %v, want about 50ms", elapsed)
	}
	name, err := a.HostName(t.Context())
	if err != nil {
		t.Fatalf("HostName after a timeout: %v", err)
	}
	if name != "web-1" {
		t.Errorf("host name: got %q, want %q", name, "web-1")
	}
}

// The agent socket may be closed under us (QEMU restarted the chardev); the call in flight fails
// with ErrClosed and the next one redials.
func TestAgentRedialAfterDisconnect(t *testing.T) {
	a := dialAgent(t,
		qmptest.Expect("guest-ping").NoReply(),
		qmptest.Disconnect(),
		qmptest.Expect("guest-ping"),
	)
	if err := a.Ping(t.Context()); !errors.Is(err, qmp.ErrClosed) {
		t.Fatalf("Ping on a closed socket: got %v, want ErrClosed", err)
	}
	if err := a.Ping(t.Context()); err != nil {
		t.Fatalf("Ping after redial: %v", err)
	}
}

// QEMU accepts the chardev connection even when no agent runs in the guest; DialAgent must give
// up at its deadline.
func TestDialAgentNoAgent(t *testing.T) {
	dir, err := os.MkdirTemp("", "qga")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	t.Cleanup(func() {
		for len(conns) > 0 {
			(<-conns).Close()
		}
	})

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = qmp.DialAgent(ctx, path)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("DialAgent: got %v, want context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("DialAgent returned after %v, want about 50ms", elapsed)
	}
}

func TestAgentFiles(t *testing.T) {
	a := dialAgent(t,
		qmptest.Expect("guest-file-open").WithArgs(map[string]string{"path": "/etc/hostname", "mode": "r"}).Return(5),
		qmptest.Expect("guest-file-read").WithArgs(map[string]any{"handle": 5, "count": 256 << 10}).
			Return(map[string]any{"count": 4, "buf-b64": b64("web\n"), "eof": false}),
		qmptest.Expect("guest-file-read").Return(map[string]any{"count": 0, "buf-b64": "", "eof": true}),
		qmptest.Expect("guest-file-close").WithArgs(map[string]int{"handle": 5}),

		qmptest.Expect("guest-file-open").WithArgs(map[string]string{"path": "/etc/hostname", "mode": "w"}).Return(6),
		qmptest.Expect("guest-file-write").WithArgs(map[string]any{"handle": 6, "buf-b64": b64("web-1\n")}).
			Return(map[string]any{"count": 6, "eof": false}),
		qmptest.Expect("guest-file-close").WithArgs(map[string]int{"handle": 6}),

		qmptest.Expect("guest-file-open").Fail("GenericError", "failed to open file '/nope' (mode: 'r'): No such file or directory"),
	)
	got, err := a.ReadFile(t.Context(), "/etc/hostname")
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	if string(got) != "web\n" {
		t.Errorf("ReadFile: got %q, want %q", got, "web\n")
	}
	if err := a.WriteFile(t.Context(), "/etc/hostname", []byte("web-1\n")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if _, err := a.ReadFile(t.Context(), "/nope"); !errors.Is(err, qmp.ErrGenericError) {
		t.Errorf("ReadFile of a missing file: got %v, want ErrGenericError", err)
	}
}

func TestAgentTimeAndInfo(t *testing.T) {
	now := time.Unix(1700000000, 123456789)
	a := dialAgent(t,
		qmptest.Expect("guest-set-time").WithArgs(nil),
		qmptest.Expect("guest-set-time").WithArgs(map[string]int64{"time": now.UnixNano()}),
		qmptest.Expect("guest-get-time").Return(now.UnixNano()),
		qmptest.Expect("guest-get-osinfo").Return(map[string]string{
			"kernel-release": "6.1.0-31-amd64", "machine": "x86_64", "id": "debian",
			"pretty-name": "Debian GNU/Linux 12 (bookworm)", "version-id": "12",
		}),
		qmptest.Expect("guest-network-get-interfaces").Return([]map[string]any{{
			"name": "eth0", "hardware-address": "52:54:00:00:00:01",
			"ip-addresses": []map[string]any{{"ip-address-type": "ipv4", "ip-address": "10.0.2.15", "prefix": 24}},
		}}),
	)
	ctx := t.Context()
	if err := a.SetTime(ctx, nil); err != nil {
		t.Fatalf("SetTime(nil): %v", err)
	}
	if err := a.SetTime(ctx, &now); err != nil {
		t.Fatalf("SetTime: %v", err)
	}
	got, err := a.GetTime(ctx)
	if err != nil {
		t.Fatalf("GetTime: %v", err)
	}
	if !got.Equal(now) {
		t.Errorf("GetTime: got %v, want %v", got, now)
	}
	info, err := a.OSInfo(ctx)
	if err != nil {
		t.Fatalf("OSInfo: %v", err)
	}
	wantInfo := qmp.OSInfo{KernelRelease: "6.1.0-31-amd64", Machine: "x86_64", ID: "debian",
		PrettyName: "Debian GNU/Linux 12 (bookworm)", VersionID: "12"}
	if info != wantInfo {
		t.Errorf("OSInfo: got %+v, want %+v", info, wantInfo)
	}
	ifs, err := a.NetworkInterfaces(ctx)
	if err != nil {
		t.Fatalf("NetworkInterfaces: %v", err)
	}
	if len(ifs) != 1 || ifs[0].HardwareAddress != "52:54:00:00:00:01" || len(ifs[0].IPAddresses) != 1 ||
		ifs[0].IPAddresses[0] != (qmp.IPAddress{Type: "ipv4", Address: "10.0.2.15", Prefix: 24}) {
		t.Errorf("NetworkInterfaces: got %+v, want eth0 52:54:00:00:00:01 with 10.0.2.15/24", ifs)
	}
}

// transportFunc is a Transport made of a function, as a libvirt driver would wrap
// virDomainQemuAgentCommand.
type transportFunc func(ctx context.Context, req []byte) ([]byte, error)

func (f transportFunc) Command(ctx context.Context, req []byte) ([]byte, error) { return f(ctx, req) }
func (transportFunc) Close() error                                              { return nil }

func TestAgentOverTransport(t *testing.T) {
	var sent []string
	a := qmp.NewAgent(transportFunc(func(_ context.Context, req []byte) ([]byte, error) {
		sent = append(sent, string(req))
		return []byte(`{"return": {"host-name": "web-1"}}`), nil
	}))
	name, err := a.HostName(t.Context())
	if err != nil {
		t.Fatalf("HostName: %v", err)
	}
	if name != "web-1" {
		t.Errorf("host name: got %q, want %q", name, "web-1")
	}
	if want := `{"execute":"guest-get-host-name"}`; len(sent) != 1 || sent[0] != want {
		t.Errorf("requests: got %q, want [%q]", sent, want)
	}
}
