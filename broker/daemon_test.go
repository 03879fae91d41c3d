package broker

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/contract"
)

// The test binary is also the broker daemon of TestDaemon, as vmfork's
// binary is vmfork broker's.
const (
	daemonDirEnv   = "VMFORK_BROKER_TEST_DAEMON"
	daemonRootsEnv = "VMFORK_BROKER_TEST_ROOTS"
	daemonIdleEnv  = "VMFORK_BROKER_TEST_IDLE"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(daemonDirEnv); dir != "" {
		os.Exit(runTestDaemon(dir))
	}
	os.Exit(m.Run())
}

// runTestDaemon is what vmfork broker does, with the tests' roots and
// names.
func runTestDaemon(dir string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := logrus.New()
	log.SetLevel(logrus.DebugLevel)
	if err := Harden(); err != nil {
		log.Error(err)
		return 1
	}
	var roots []*x509.Certificate
	data, _ := os.ReadFile(os.Getenv(daemonRootsEnv))
	if b, _ := pem.Decode(data); b != nil {
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			log.Error(err)
			return 1
		}
		roots = append(roots, c)
	}
	idle, _ := time.ParseDuration(os.Getenv(daemonIdleEnv))
	srv, err := NewServer(Config{Dir: dir, Idle: idle, Log: logrus.NewEntry(log),
		Proxy: Options{ExtraRoots: roots, LookupNetIP: lookupTest}})
	if err != nil {
		log.Error(err)
		return 1
	}
	if err := srv.Serve(ctx); err != nil && err != ErrRunning {
		log.Error(err)
		return 1
	}
	return 0
}

// daemonStarter starts the test binary as a broker for dir, detached as
// vmfork starts vmfork broker, and kills what it started at the end.
func daemonStarter(t *testing.T, dir string, roots string) Starter {
	return func(context.Context) error {
		logf, err := os.OpenFile(filepath.Join(dir, LogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		defer logf.Close()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), daemonDirEnv+"="+dir, daemonRootsEnv+"="+roots, daemonIdleEnv+"=300ms")
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return err
		}
		t.Cleanup(func() { cmd.Process.Kill() })
		go cmd.Wait()
		return nil
	}
}

// TestDaemon runs the broker as vmfork runs it: a process of its own,
// started on demand, that outlives its clients; killed, the machines'
// proxies refuse; revived, it serves them again from its registry, with
// the values it can resolve itself; idle, it exits.
func TestDaemon(t *testing.T) {
	r := newRig(t)
	dir, err := shortTempDir(t)
	if err != nil {
		t.Fatal(err)
	}
	roots := filepath.Join(dir, "roots.pem")
	os.WriteFile(roots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.pki.root.Raw}), 0o600)
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, LogFile))
			t.Logf("the broker's log:\n%s", log)
		}
	})
	client := &Client{Dir: dir, Start: daemonStarter(t, dir, roots)}

	a, pha := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	a.Secrets[0].Value = nil // the broker runs the hook
	b, phb := r.child("b", Addr{Network: "unix", Address: filepath.Join(dir, "b.sock")})
	b.Secrets[0].Secret.ValueFrom = contract.ValueFrom{Env: "B_TOKEN"}
	b.Secrets[0].Value = []byte("env-value-of-b")
	addrA, err := client.Register(t.Context(), a)
	if err != nil {
		t.Fatal(err)
	}
	addrB, err := client.Register(t.Context(), b)
	if err != nil {
		t.Fatal(err)
	}
	r.ca, err = LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	get := func(addr Addr, ph string) (int, string, string) {
		t.Helper()
		resp, body := do(t, r.guest(addr), "GET", r.api.urlAt(apiHost, "/"), map[string]string{"Authorization": bearer(ph)}, "")
		got := ""
		if resp.StatusCode == 200 {
			got = r.api.last(t).Header.Get("Authorization")
		}
		return resp.StatusCode, body, got
	}
	expect := func(when string, addr Addr, ph string, wantStatus int, wantAuth, wantBody string) {
		t.Helper()
		status, body, auth := get(addr, ph)
		if status != wantStatus || auth != wantAuth || !strings.Contains(body, wantBody) {
			t.Errorf("%s: %d %q, the server got %q; want %d %q, the server %q", when, status, body, auth, wantStatus, wantBody, wantAuth)
		}
	}
	expect("a", addrA, pha, 200, "Bearer "+valueOf("a"), "ok")
	expect("b", addrB, phb, 200, "Bearer env-value-of-b", "ok")
	noValueOnDisk(t, dir, valueOf("a"), "env-value-of-b")

	// Killed: nothing listens for the machines, which see a refusal, never
	// a pass-through without their secrets' rules.
	pid := client.PID()
	if pid == 0 || pid == os.Getpid() {
		t.Fatalf("broker PID %d", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the killed broker's lock to be free", func() bool { return client.PID() == 0 })
	refused(t, addrA)
	refused(t, addrB)

	// The next vmfork command revives it: the exec value is resolved
	// again, the env value is lost until b is registered again.
	lost, err := client.Revive(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(lost) != 1 || lost[0].Name != "b" {
		t.Errorf("Revive: lost %+v, want b", lost)
	}
	if p := client.PID(); p == 0 || p == pid {
		t.Errorf("after Revive: broker PID %d (the killed one was %d)", p, pid)
	}
	expect("a, revived", addrA, pha, 200, "Bearer "+valueOf("a"), "ok")
	expect("b, revived without its value", addrB, phb, http.StatusServiceUnavailable, "", "secret TOKEN has no value")
	if _, err := client.Register(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	expect("b, registered again", addrB, phb, 200, "Bearer env-value-of-b", "ok")

	// The last machine gone, it exits once idle.
	for _, name := range []string{"a", "b"} {
		if err := client.Unregister(t.Context(), name); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the idle broker to exit", func() bool { return client.PID() == 0 })
	if lost, err := client.Revive(t.Context()); err != nil || lost != nil || client.PID() != 0 {
		t.Errorf("Revive with nothing registered: %v, %v, PID %d; want nothing started", lost, err, client.PID())
	}
}

func TestUnregisterWithoutABroker(t *testing.T) {
	r := newRig(t)
	dir, err := shortTempDir(t)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	b, _ := r.child("b", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	// As a killed broker leaves it.
	if err := writeRegistry(dir, []Child{a, b}); err != nil {
		t.Fatal(err)
	}
	client := &Client{Dir: dir} // may not start one
	if err := client.Unregister(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	left, err := readRegistry(dir)
	if err != nil || len(left) != 1 || left[0].Name != "b" {
		t.Errorf("registry after Unregister: %+v, %v; want b alone", left, err)
	}
	if _, err := client.Register(t.Context(), a); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Register without a Starter or a broker: %v, want ErrNotRunning", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
