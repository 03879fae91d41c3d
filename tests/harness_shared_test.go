//go:build integration

package tests

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The shared Debian template (tests/doc.go, "Shared Debian template"):
// booting the Debian guest and waiting for systemd costs 35-40 s of TCG
// CPU, a fork from a kept template of it about 4 s. So the Debian guest
// on QEMU's user network (variant ifupdown-nodbus) is booted once per test
// process, settled, kept and exported to an archive; each test that needs
// such a machine imports the archive into its own state dir and forks it.

// debianBase is the name of the shared template, in the fixture's store
// and in every test's store that imported it.
const debianBase = "debian-base"

var shared struct {
	once    sync.Once
	archive string // the exported template
	err     error  // why there is none: every caller fails with it
	// runDir and memDir are the fixture's, made on first use and removed
	// by TestMain; runDir holds its state dir and the archive.
	runDir, memDir string
}

// TestMain runs the tests, then removes what the shared fixture left: its
// QEMU processes (by PID, should a failed fixture have left one) and dirs.
func TestMain(m *testing.M) {
	code := m.Run()
	if shared.runDir != "" {
		fx := &env{stateDir: filepath.Join(shared.runDir, "state"), memDir: shared.memDir}
		killQEMUs(fx)
		os.RemoveAll(shared.runDir)
	}
	os.Exit(code)
}

// killQEMUs kills every QEMU process started with e's state dir, those in
// its records and any other, then removes its mem dir (env.cleanup).
func killQEMUs(e *env) {
	for _, pid := range e.qemuProcesses() {
		syscall.Kill(pid, syscall.SIGKILL)
		waitExit(pid, e.stateDir, 10*time.Second)
	}
	e.cleanup()
}

// sharedDebianArchive returns the archive of the shared Debian template,
// made on the first call of the process (lazily: a run that needs no Debian
// machine boots none). Concurrent callers wait for the first; if making it
// failed, every caller fails with the same message.
func sharedDebianArchive(t testing.TB) string {
	t.Helper()
	deb := debianGuest(t) // fails the caller, with nothing made, if there is no guest
	bin := os.Getenv("VMFORK_BIN")
	if bin == "" {
		t.Fatal("VMFORK_BIN is not set: run the integration tests with `make integration`")
	}
	shared.once.Do(func() {
		start := time.Now()
		shared.archive, shared.err = makeDebianArchive(bin, deb)
		if shared.err == nil {
			t.Logf("shared Debian template: booted, settled and exported in %v", time.Since(start).Round(time.Second))
		}
	})
	if shared.err != nil {
		t.Fatalf("shared Debian template: %v", shared.err)
	}
	return shared.archive
}

// makeDebianArchive boots the Debian guest in its own store, settles it,
// keeps it as debianBase and exports that; then it gives up the template
// and the machine, so that nothing of it runs. It never calls t.Fatal (it
// runs under sync.Once, for whichever test came first): it returns errors.
func makeDebianArchive(bin string, deb debianImage) (archive string, err error) {
	var v *debianVariant
	for i := range deb.Variants {
		if deb.Variants[i].Name == "ifupdown-nodbus" {
			v = &deb.Variants[i]
		}
	}
	if v == nil {
		return "", fmt.Errorf("the Debian guest has no variant ifupdown-nodbus (have %v)", deb.variantNames())
	}
	if shared.runDir, err = os.MkdirTemp("", "vmfork-shared-"); err != nil {
		return "", err
	}
	// RAM files need a tmpfs.
	if shared.memDir, err = os.MkdirTemp("/dev/shm", "vmfork-shared-"); err != nil {
		return "", err
	}
	fx := &env{bin: bin, stateDir: filepath.Join(shared.runDir, "state"), memDir: shared.memDir}
	cli := func(args ...string) (string, error) {
		cmd := exec.Command(bin, append([]string{"--state-dir", fx.stateDir, "--mem-dir", fx.memDir}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return out.String(), fmt.Errorf("vmfork %s: %v: %s", verbOf(args), err, strings.TrimSpace(errb.String()))
		}
		return out.String(), nil
	}
	// Whatever happens, nothing of the fixture runs afterwards.
	defer killQEMUs(fx)
	if _, err := cli("--timeout", debianBootTimeout.String(), "boot", "deb", "--kernel", deb.Kernel, "--initrd", deb.Initrd,
		"--disk", deb.Disk, "--append", v.Append, "--memory", debianMemory); err != nil {
		return "", err
	}
	// Kept once systemd is done, as users keep a machine they warmed
	// (debianEnv.settle, which needs a test).
	out, _ := cli("--timeout", "5m", "exec", "deb", "--", "timeout", "240", "systemctl", "is-system-running", "--wait")
	if st := strings.TrimSpace(out); st != "running" && st != "degraded" {
		return "", fmt.Errorf("deb: systemd did not finish booting: %q", st)
	}
	if _, err := cli("template", "save", "deb", debianBase); err != nil {
		return "", err
	}
	archive = filepath.Join(shared.runDir, debianBase+".vmt")
	if _, err := cli("template", "export", debianBase, archive); err != nil {
		return "", err
	}
	if _, err := cli("template", "rm", debianBase); err != nil {
		return "", err
	}
	if _, err := cli("rm", "--force", "deb"); err != nil {
		return "", err
	}
	if left := fx.qemuProcesses(); len(left) > 0 {
		return "", fmt.Errorf("QEMU processes %v still run after rm", left)
	}
	return archive, nil
}

// verbOf is the verb and operands of a vmfork command line, without its
// flags (the boot's kernel command line would make a line of 400 bytes).
func verbOf(args []string) string {
	var words []string
	for i := 0; i < len(args); i++ {
		switch {
		case args[i] == "--timeout":
			i++
		case strings.HasPrefix(args[i], "-"):
			return strings.Join(words, " ")
		default:
			words = append(words, args[i])
		}
	}
	return strings.Join(words, " ")
}

// forkDebian gives the test a settled Debian machine called name, on QEMU's
// user network (variant ifupdown-nodbus, debianMemory): a child of the
// shared template, imported into this env's store on first use. As every
// child of a kept template, it has its own identity: hostname name, a new
// MAC and DHCP lease, its own machine-id.
func (e *debianEnv) forkDebian(name string) machineJSON {
	e.t.Helper()
	return e.env.forkDebian(name)
}

// forkDebian is debianEnv.forkDebian for an env of any guest (a driverEnv
// of the embedded driver: an archive names the driver it was exported
// with, and imports under that one only).
func (e *env) forkDebian(name string) machineJSON {
	e.t.Helper()
	if !e.debianImported {
		e.ok("template", "import", sharedDebianArchive(e.t), "--as", debianBase)
		e.debianImported = true
	}
	var res forkJSON
	e.jsonOK(&res, "fork", debianBase, name)
	if len(res.Children) != 1 || res.Children[0].Name != name || len(res.Failed) != 0 {
		e.t.Fatalf("fork %s %s: %+v, want the child %s", debianBase, name, res, name)
	}
	// The fork's JSON says how it went; ls has the machine's record
	// (memory, CPUs, RAM file, serial log) as boot's JSON has it.
	return e.machine(name)
}
