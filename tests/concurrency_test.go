//go:build integration

package tests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// concurrencyCmdTimeout bounds each command of the concurrency test: commands
// queue on the source's lock and share two contended cores under TCG.
const concurrencyCmdTimeout = 8 * time.Minute

// TestConcurrency runs vmfork commands at the same time against one state dir:
// 8 forks of one source, then 8 forks spread over 4 sources, each mixed with
// rm, ls and template save/ls/rm. Every command must succeed or fail with a
// one-line error; afterwards the live machines have no duplicate name, MAC,
// host port or vmgenid, no source is paused, and every QEMU under the state
// dir has a record.
func TestConcurrency(t *testing.T) {
	parallel(t) // heavy and self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	srcs := []string{"ca", "cb", "cc", "cd"}
	var boots []cmdSpec
	for _, s := range srcs {
		boots = append(boots, cmdSpec{"boot", s, "--kernel", e.guest.Kernel, "--initrd", e.guest.Initrd,
			"--disk", e.guest.Disk, "--memory", "256M", "--port", "22"})
	}
	for _, r := range e.concurrently(boots) {
		if r.code != 0 {
			t.Fatalf("%s: %s", r.args, r.result)
		}
	}
	// Made ahead so that the burst can remove them while it forks.
	e.ok("fork", "ca", "pre-1", "pre-2")
	e.ok("template", "save", "cb", "keep-pre")

	var burst []cmdSpec
	for i := 1; i <= 8; i++ {
		burst = append(burst, cmdSpec{"fork", "ca", fmt.Sprintf("one-%d", i)})
	}
	burst = append(burst,
		cmdSpec{"rm", "pre-1"}, cmdSpec{"ls"}, cmdSpec{"ls"},
		cmdSpec{"template", "save", "ca", "keep-a"}, cmdSpec{"template", "ls"},
		cmdSpec{"template", "rm", "keep-pre"})
	e.checkBurst("one source", e.concurrently(burst))
	e.checkLive("one source", srcs)

	// Keep the number of QEMUs modest for TCG: clear most of the first burst
	// now; the second burst removes the rest while it forks.
	e.ok("rm", "pre-2", "one-1", "one-2", "one-3", "one-4", "one-5", "one-6")
	burst = nil
	for i, s := range srcs {
		burst = append(burst, cmdSpec{"fork", s, fmt.Sprintf("many-%d", 2*i+1)},
			cmdSpec{"fork", s, fmt.Sprintf("many-%d", 2*i+2)})
	}
	burst = append(burst,
		cmdSpec{"rm", "one-7"}, cmdSpec{"rm", "one-8"}, cmdSpec{"ls"},
		cmdSpec{"template", "rm", "keep-a"}, cmdSpec{"template", "save", "cc", "keep-c"},
		cmdSpec{"template", "ls"})
	e.checkBurst("many sources", e.concurrently(burst))
	e.checkLive("many sources", srcs)
}

// cmdSpec is one CLI invocation's arguments.
type cmdSpec []string

// cmdResult is one concurrent invocation's outcome.
type cmdResult struct {
	result
	args string
	err  error
}

// concurrently starts every command at once and waits for all of them. It
// runs the CLI itself, not through e.vmfork, which may call t.Fatal: that
// must not happen in a goroutine.
func (e *env) concurrently(cmds []cmdSpec) []cmdResult {
	out := make([]cmdResult, len(cmds))
	var wg sync.WaitGroup
	for i, c := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = e.runQuiet(c)
		}()
	}
	wg.Wait()
	return out
}

// runQuiet runs one command with -q, so that stderr holds nothing but the
// error, and --json where the command prints a result.
func (e *env) runQuiet(c cmdSpec) cmdResult {
	args := append([]string{"-q", "--state-dir", e.stateDir, "--mem-dir", e.memDir}, c...)
	if c[0] != "rm" && !(c[0] == "template" && c[1] == "rm") {
		args = append(args, "--json")
	}
	ctx, cancel := context.WithTimeout(context.Background(), concurrencyCmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bin, args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	r := cmdResult{result: result{stdout: so.String(), stderr: se.String()}, args: strings.Join(c, " ")}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		r.err = err
	}
	if ctx.Err() != nil {
		r.err = fmt.Errorf("still running after %v", concurrencyCmdTimeout)
	}
	return r
}

// checkBurst checks that every command either succeeded with JSON on stdout
// or failed with one line on stderr.
func (e *env) checkBurst(label string, rs []cmdResult) {
	t := e.t
	t.Helper()
	failed := 0
	for _, r := range rs {
		switch {
		case r.err != nil:
			t.Errorf("%s: vmfork %s: %v", label, r.args, r.err)
		case r.code == 0:
			if r.stderr != "" {
				t.Errorf("%s: vmfork %s succeeded but wrote to stderr under -q: %q", label, r.args, r.stderr)
			}
		default:
			failed++
			lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "vmfork: ") {
				t.Errorf("%s: vmfork %s failed without a one-line error: %s", label, r.args, r.result)
			}
			// Nothing in the burst is bad input, and every fork could
			// wait for its source's lock: a failure is a finding.
			t.Errorf("%s: vmfork %s failed: %s", label, r.args, r.result)
		}
	}
	t.Logf("%s: %d commands, %d failed", label, len(rs), failed)
}

var (
	argvMAC  = regexp.MustCompile(`mac=([0-9a-f:]{17})`)
	argvPort = regexp.MustCompile(`hostfwd=tcp:127\.0\.0\.1:(\d+)-`)
)

// checkLive checks the live machines after a burst: unique names, MACs, host
// ports and vmgenids, as the QEMU processes and the guests have them; every
// QEMU under the state dir recorded; every source running and answering.
func (e *env) checkLive(label string, srcs []string) {
	t := e.t
	t.Helper()
	ms := e.list()
	recorded := map[int]string{}
	names := map[string]bool{}
	macs, ports, genids := map[string]string{}, map[int]string{}, map[string]string{}
	for _, m := range ms {
		if names[m.Name] {
			t.Errorf("%s: machine %s listed twice", label, m.Name)
		}
		names[m.Name] = true
		if m.State != "running" {
			t.Errorf("%s: machine %s is %s, want running", label, m.Name, m.State)
			continue
		}
		recorded[m.PID] = m.Name
		cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(m.PID) + "/cmdline")
		if err != nil || !ownedQEMU(m.PID, e.stateDir) {
			t.Errorf("%s: %s is running with pid %d, but no such QEMU runs", label, m.Name, m.PID)
			continue
		}
		argv := string(cmdline)
		if !strings.Contains(argv, "guest="+m.Name+"\x00") {
			t.Errorf("%s: pid %d of %s is not named %s", label, m.PID, m.Name, m.Name)
		}
		// The guest's MAC is the record's: a child's NIC is configured with
		// the MAC its identity chain gave the guest.
		mac := m.MAC
		if mm := argvMAC.FindStringSubmatch(argv); mm != nil {
			mac = mm[1]
		}
		if other, dup := macs[mac]; dup {
			t.Errorf("%s: %s and %s both have MAC %s", label, other, m.Name, mac)
		}
		macs[mac] = m.Name
		for _, pm := range argvPort.FindAllStringSubmatch(argv, -1) {
			p, _ := strconv.Atoi(pm[1])
			if other, dup := ports[p]; dup {
				t.Errorf("%s: %s and %s both forward host port %d", label, other, m.Name, p)
			}
			ports[p] = m.Name
		}
		status, genid := e.qmpStatusGenID(m.QMP)
		if status != "running" {
			t.Errorf("%s: %s is %q in QEMU, want running", label, m.Name, status)
		}
		if other, dup := genids[genid]; dup && genid != "" {
			t.Errorf("%s: %s and %s both have vmgenid %s", label, other, m.Name, genid)
		}
		genids[genid] = m.Name
	}
	for _, pid := range e.qemuProcesses() {
		if _, ok := recorded[pid]; !ok {
			cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			t.Errorf("%s: QEMU pid %d runs with no record: %s", label, pid, strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	for _, s := range srcs {
		if !names[s] {
			t.Errorf("%s: source %s is gone", label, s)
			continue
		}
		e.exec(s, "true") // the source's agent answers
	}
	t.Logf("%s: %d live machines, %d MACs, %d host ports, %d vmgenids", label, len(ms), len(macs), len(ports), len(genids))
}

// qmpStatusGenID returns the run state and the vmgenid QEMU reports through
// the QMP socket sock.
func (e *env) qmpStatusGenID(sock string) (status, genid string) {
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	mon, err := qmp.Dial(ctx, sock)
	if err != nil {
		return "unreachable: " + err.Error(), ""
	}
	defer mon.Close()
	st, err := mon.QueryStatus(ctx)
	if err != nil {
		return "unknown: " + err.Error(), ""
	}
	if genid, err = qmp.QueryVMGenerationID(ctx, mon); err != nil {
		e.t.Errorf("query vmgenid through %s: %v", sock, err)
	}
	return st.Status, genid
}
