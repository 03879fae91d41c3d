//go:build integration

package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// libvirtURI is the daemon the libvirt tests use; scripts/libvirtd.sh starts it.
const libvirtURI = "qemu:///system"

// driverEnv is an env whose every CLI call selects one driver: the embedded
// one (no flags) or libvirt (--connect). Machine names carry a prefix unique
// to the test, because libvirt domain names are host-wide.
type driverEnv struct {
	*env
	driver string   // the driver name records carry: "qemu" or "libvirt"
	args   []string // global flags that select it
	prefix string
}

// newDriverEnv returns a driverEnv for the driver args select. For libvirt it
// makes sure the host is set up, and removes every domain of the test when it
// ends, pass or fail.
func newDriverEnv(t testing.TB, args []string) *driverEnv {
	t.Helper()
	return newDriverEnvGuest(t, args, testGuest(t))
}

// newDriverEnvGuest is newDriverEnv for another guest than the busybox test
// guest.
func newDriverEnvGuest(t testing.TB, args []string, g guest) *driverEnv {
	t.Helper()
	e := newEnvGuest(t, g)
	sum := sha256.Sum256([]byte(e.stateDir))
	d := &driverEnv{env: e, driver: "qemu", args: args, prefix: "t" + hex.EncodeToString(sum[:3]) + "-"}
	if slices.Contains(args, "--connect") {
		d.driver = "libvirt"
		libvirtSetup(t, e)
		// Registered after newEnv's cleanup, so it runs first: libvirt
		// destroys its domains before the dirs they use go.
		t.Cleanup(func() { removeDomains(t, d.prefix) })
	}
	return d
}

var (
	setupOnce sync.Once
	setupErr  string
)

// libvirtSetup runs `vmfork libvirt setup` once per test binary: the hook
// must run the vmfork under test.
func libvirtSetup(t testing.TB, e *env) {
	t.Helper()
	setupOnce.Do(func() {
		out, err := exec.Command(e.bin, "libvirt", "setup").CombinedOutput()
		if err != nil {
			setupErr = "vmfork libvirt setup: " + err.Error() + ": " + string(out)
		}
	})
	if setupErr != "" {
		t.Fatal(setupErr)
	}
}

// n returns the test's name for machine s.
func (d *driverEnv) n(s string) string { return d.prefix + s }

func (d *driverEnv) cli(args ...string) result {
	d.t.Helper()
	return d.vmfork(append(slices.Clone(d.args), args...)...)
}

func (d *driverEnv) cliOK(args ...string) result {
	d.t.Helper()
	r := d.cli(args...)
	if r.code != 0 {
		d.t.Fatalf("vmfork %s: %s", strings.Join(args, " "), r)
	}
	return r
}

func (d *driverEnv) cliJSON(v any, args ...string) {
	d.t.Helper()
	r := d.cliOK(append(args, "--json")...)
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		d.t.Fatalf("vmfork %s --json: stdout is not JSON: %v\n%s", strings.Join(args, " "), err, r.stdout)
	}
}

func (d *driverEnv) bootGuest(name string, extra ...string) machineJSON {
	d.t.Helper()
	var m machineJSON
	g := d.guest
	d.cliJSON(&m, append([]string{"boot", name, "--kernel", g.Kernel, "--initrd", g.Initrd, "--disk", g.Disk, "--memory", "256M"}, extra...)...)
	return m
}

func (d *driverEnv) run(name string, argv ...string) string {
	d.t.Helper()
	return d.cliOK(append([]string{"exec", name, "--"}, argv...)...).stdout
}

func (d *driverEnv) machines() map[string]machineJSON {
	d.t.Helper()
	var ms []machineJSON
	d.cliJSON(&ms, "ls")
	out := map[string]machineJSON{}
	for _, m := range ms {
		out[m.Name] = m
	}
	return out
}

// driverOf returns the driver ls names for machine name.
func (d *driverEnv) driverOf(name string) string {
	d.t.Helper()
	var ms []struct {
		Name   string `json:"name"`
		Driver string `json:"driver"`
	}
	d.cliJSON(&ms, "ls")
	for _, m := range ms {
		if m.Name == name {
			return m.Driver
		}
	}
	return ""
}

func (d *driverEnv) count(name string) int {
	d.t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(d.run(name, "cat", "/run/counter")))
	if err != nil {
		d.t.Fatalf("counter of %s: %v", name, err)
	}
	return n
}

// leftovers lists what of this test still runs: QEMU processes started with
// its state dir and, for libvirt, its domains and their RAM directories.
func (d *driverEnv) leftovers() []string {
	var out []string
	for _, pid := range d.qemuProcesses() {
		out = append(out, "qemu pid "+strconv.Itoa(pid))
	}
	if d.driver == "libvirt" {
		for _, n := range domains(d.t, d.prefix) {
			out = append(out, "domain "+n)
		}
		dirs, _ := filepath.Glob("/dev/shm/libvirt/qemu/*-" + d.prefix + "*")
		out = append(out, dirs...)
	}
	return out
}

// virsh runs virsh against libvirtURI.
func virsh(t testing.TB, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command("virsh", append([]string{"-c", libvirtURI}, args...)...).CombinedOutput()
	return string(out), err
}

func virshOK(t testing.TB, args ...string) string {
	t.Helper()
	out, err := virsh(t, args...)
	if err != nil {
		t.Fatalf("virsh %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

// domains lists the domains, running or defined, whose names start with prefix.
func domains(t testing.TB, prefix string) []string {
	t.Helper()
	out, err := virsh(t, "list", "--all", "--name")
	if err != nil {
		t.Errorf("virsh list: %v: %s", err, out)
		return nil
	}
	var ns []string
	for _, n := range strings.Fields(out) {
		if strings.HasPrefix(n, prefix) {
			ns = append(ns, n)
		}
	}
	return ns
}

// removeDomains destroys and undefines every domain of the test.
func removeDomains(t testing.TB, prefix string) {
	for _, n := range domains(t, prefix) {
		virsh(t, "destroy", n)
		virsh(t, "undefine", n)
	}
}

// eventually polls cond every 100 ms for up to d.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
