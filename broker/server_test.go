package broker

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/contract"
)

// served is a broker's Serve running in this process.
type serving struct {
	done chan struct{} // closed when Serve has returned
	err  error
}

// startServer runs a broker in this process for dir.
func startServer(t *testing.T, dir string, idle time.Duration, opts Options) (*Server, *serving) {
	t.Helper()
	srv, err := NewServer(Config{Dir: dir, Idle: idle, PIDPoll: 50 * time.Millisecond, Proxy: opts, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &serving{done: make(chan struct{})}
	go func() {
		run.err = srv.Serve(ctx)
		close(run.done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-run.done:
			if run.err != nil {
				t.Errorf("Serve: %v", run.err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the broker did not stop")
		}
	})
	return srv, run
}

// waitExit waits for a broker's Serve to return.
func waitExit(t *testing.T, run *serving, within time.Duration) {
	t.Helper()
	select {
	case <-run.done:
		if run.err != nil {
			t.Errorf("Serve: %v", run.err)
		}
	case <-time.After(within):
		t.Fatalf("the broker did not exit within %v", within)
	}
}

// noStart is a Starter for a broker that runs in this process already:
// Ensure then only waits for it to answer.
func noStart(context.Context) error { return nil }

func refused(t *testing.T, a Addr) {
	t.Helper()
	c, err := net.Dial(a.Network, a.Address)
	if err == nil {
		c.Close()
		t.Errorf("%s: a connection was accepted, want it refused", a)
	}
}

func TestServerControlSocket(t *testing.T) {
	r := newRig(t)
	dir, err := shortTempDir(t)
	if err != nil {
		t.Fatal(err)
	}
	// Idle long enough for the first registration to come first.
	_, done := startServer(t, dir, 2*time.Second, r.opts)
	client := &Client{Dir: dir, Start: noStart}
	r.ca, _ = LoadOrCreateCA(dir) // the broker's CA, which the guests trust

	a, pha := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	a.Secrets[0].Value = nil // the broker runs the hook itself
	b, phb := r.child("b", Addr{Network: "unix", Address: filepath.Join(dir, "b.sock")})
	addrA, err := client.Register(t.Context(), a)
	if err != nil {
		t.Fatal(err)
	}
	if _, port, _ := net.SplitHostPort(addrA.Address); port == "0" || addrA.Network != "tcp" {
		t.Errorf("Register returned %s, want the port listened on", addrA)
	}
	addrB, err := client.Register(t.Context(), b)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		addr Addr
		ph   string
	}{{"a", addrA, pha}, {"b", addrB, phb}} {
		resp, body := do(t, r.guest(tc.addr), "GET", r.api.urlAt(apiHost, "/"), map[string]string{"Authorization": bearer(tc.ph)}, "")
		if got, want := r.api.last(t).Header.Get("Authorization"), "Bearer "+valueOf(tc.name); resp.StatusCode != 200 || got != want {
			t.Errorf("%s: %d %q, the server got %q, want %q", tc.name, resp.StatusCode, body, got, want)
		}
	}

	list, err := client.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "a" || list[1].Name != "b" || !list[0].Secrets[0].HasValue ||
		list[0].Secrets[0].Source != "exec" || list[0].Listen != addrA || list[0].Secrets[0].Placeholder != pha {
		t.Errorf("List: %+v", list)
	}

	// The broker's files: modes, and no value in any of them.
	for name, want := range map[string]os.FileMode{SocketFile: 0o600, RegistryFile: 0o600, PIDFile: 0o600, "b.sock": 0o600} {
		if got := mode(t, filepath.Join(dir, name)); got != want {
			t.Errorf("%s: mode %#o, want %#o", name, got, want)
		}
	}
	noValueOnDisk(t, dir, valueOf("a"), valueOf("b"))
	if pid := client.PID(); pid != os.Getpid() {
		t.Errorf("PID %d, want this process's %d", pid, os.Getpid())
	}

	// Registered again at the same address: same listener, new value.
	a.Listen = addrA
	a.Secrets[0].Value = []byte("rotated")
	if again, err := client.Register(t.Context(), a); err != nil || again != addrA {
		t.Fatalf("register again: %s, %v; want %s", again, err, addrA)
	}
	do(t, r.guest(addrA), "GET", r.api.urlAt(apiHost, "/"), map[string]string{"Authorization": bearer(pha)}, "")
	if got := r.api.last(t).Header.Get("Authorization"); got != "Bearer rotated" {
		t.Errorf("after a new registration: %q, want the new value", got)
	}

	// Bad registrations, refused with the sentinel across the socket.
	bad := b
	bad.Name, bad.Listen = "bad", Addr{Network: "tcp", Address: "127.0.0.1:0"}
	bad.Secrets = []Binding{{Name: "TOKEN", Secret: b.Secrets[0].Secret, Placeholder: "TOKEN"}}
	if _, err := client.Register(t.Context(), bad); !errors.Is(err, contract.ErrInvalid) {
		t.Errorf("a bad placeholder: %v, want ErrInvalid", err)
	}
	bad.Listen, bad.Secrets = addrB, b.Secrets
	if _, err := client.Register(t.Context(), bad); !errors.Is(err, contract.ErrInvalid) || !strings.Contains(err.Error(), `machine "b"`) {
		t.Errorf("another machine's address: %v, want ErrInvalid naming b", err)
	}
	bad.Listen = Addr{Network: "tcp", Address: "127.0.0.1:0"}
	bad.Secrets = []Binding{{Name: "TOKEN", Placeholder: phb,
		Secret: contract.Secret{Hosts: []string{apiHost}, ValueFrom: contract.ValueFrom{Env: "X"}}}}
	if _, err := client.Register(t.Context(), bad); !errors.Is(err, ErrNoValue) {
		t.Errorf("an env secret without its value: %v, want ErrNoValue", err)
	}

	if err := client.Unregister(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	refused(t, addrA)
	if list, _ := client.List(t.Context()); len(list) != 1 {
		t.Errorf("after Unregister: %+v", list)
	}
	if err := client.Unregister(t.Context(), "nosuch"); err != nil {
		t.Errorf("unregister an unknown machine: %v", err)
	}
	// The last one gone, the broker exits once idle, and takes its files.
	if err := client.Unregister(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	refused(t, addrB)
	waitExit(t, done, 10*time.Second)
	for _, f := range []string{SocketFile, PIDFile, RegistryFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", f, err)
		}
	}
	if err := client.Ping(t.Context()); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Ping after the exit: %v, want ErrNotRunning", err)
	}
}

// noValueOnDisk fails if any file under dir holds one of values.
func noValueOnDisk(t *testing.T, dir string, values ...string) {
	t.Helper()
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		data, _ := os.ReadFile(path)
		for _, v := range values {
			if strings.Contains(string(data), v) {
				t.Errorf("%s holds value %q", path, v)
			}
		}
		return nil
	})
}

func TestServerExitsWhenNothingIsRegistered(t *testing.T) {
	dir, err := shortTempDir(t)
	if err != nil {
		t.Fatal(err)
	}
	srv, done := startServer(t, dir, 100*time.Millisecond, Options{})
	waitExit(t, done, 5*time.Second)
	// One that has begun to exit refuses registrations: the client goes
	// to the next broker.
	ph, _ := NewPlaceholder("TOKEN")
	_, err = srv.Register(t.Context(), Child{ChildInfo: ChildInfo{Name: "late"}, Listen: Addr{Network: "tcp", Address: "127.0.0.1:0"},
		Secrets: []Binding{{Name: "TOKEN", Placeholder: ph, Value: []byte("v"),
			Secret: contract.Secret{Hosts: []string{apiHost}, ValueFrom: contract.ValueFrom{Env: "X"}}}}})
	if !errors.Is(err, ErrExiting) {
		t.Errorf("Register on an exited broker: %v, want ErrExiting", err)
	}
}

func TestOnlyOneServerPerDirectory(t *testing.T) {
	dir, err := shortTempDir(t)
	if err != nil {
		t.Fatal(err)
	}
	startServer(t, dir, time.Minute, Options{})
	c := &Client{Dir: dir, Start: noStart}
	if err := c.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	second, err := NewServer(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Serve(t.Context()); !errors.Is(err, ErrRunning) {
		t.Errorf("a second broker: %v, want ErrRunning", err)
	}
}

func TestMachineWhoseProcessIsGoneIsDropped(t *testing.T) {
	r := newRig(t)
	dir, err := shortTempDir(t)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := startServer(t, dir, time.Minute, r.opts)
	if err := (&Client{Dir: dir, Start: noStart}).Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	a, _ := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	a.PID = deadPID(t)
	b, _ := r.child("b", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	b.PID = os.Getpid()
	for _, c := range []Child{a, b} {
		if _, err := srv.Register(t.Context(), c); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "a to be dropped", func() bool { return len(srv.List()) == 1 })
	if l := srv.List(); l[0].Name != "b" {
		t.Errorf("left: %+v, want b", l)
	}
}

// deadPID is the PID of a process that has exited (and been reaped).
func deadPID(t *testing.T) int {
	t.Helper()
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait()
	if alive(p.Pid) {
		t.Skip("PID " + strconv.Itoa(p.Pid) + " was reused at once")
	}
	return p.Pid
}
