//go:build integration

package tests

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// badCase is one bad command line: the exit code it must get and what its
// one-line error must say.
type badCase struct {
	name string
	args []string
	code int
	says string
}

// runBadCases runs each case and checks the exit code, the message, that the
// error is one line, and (through after) that nothing changed.
func runBadCases(t *testing.T, e *env, cases []badCase, after func(t *testing.T)) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.vmfork(c.args...)
			if r.code != c.code {
				t.Errorf("exit code %d, want %d (%s)", r.code, c.code, r)
			}
			if !strings.Contains(r.stderr, c.says) {
				t.Errorf("stderr %q does not say %q", r.stderr, c.says)
			}
			if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n != 0 {
				t.Errorf("error is %d lines, want one: %q", n+1, r.stderr)
			}
			after(t)
		})
	}
}

// TestBadInputTable is the bad-input table of issue 12: names, counts, sizes,
// ports, flags, files and records, each refused with one line and exit 2
// (4 for a name that does not exist, 5 for what admission refuses), changing nothing.
func TestBadInputTable(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	g := e.guest
	dir := t.TempDir()
	boot := func(name string, extra ...string) []string {
		return append([]string{"boot", name, "--kernel", g.Kernel, "--initrd", g.Initrd, "--memory", "256M"}, extra...)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A qcow2 header with an unknown version: QEMU would refuse it only
	// after vmfork made the machine.
	qcow2 := []byte("QFI\xfb\x00\x00\x00\x09")
	badQcow2 := write("v9.qcow2", append(qcow2, make([]byte, 4096)...))
	textDisk := write("passwd", []byte("root:x:0:0:root:/root:/bin/bash\n"))
	noQEMU := filepath.Join(dir, "qemu-system-x86_64")
	// A delta archive (export --base) against a template this host lacks:
	// its line, with the header's sha256, and the header frame.
	deltaHdr := []byte(`{"format":1,"base":{"name":"golden-old","id":"web.1","chunk_map_sha256":"` + strings.Repeat("ab", 32) +
		`"},"manifest":{"format":1,"chunk_size":2097152,"template":{"name":"golden-v2","source":"web"},"host":{},"files":[]},"want":{"chunks":[]}}`)
	sum := sha256.Sum256(deltaHdr)
	delta := write("v2.vmd", slices.Concat([]byte("VMFORK-DELTA 1 "+hex.EncodeToString(sum[:])+"\n"),
		[]byte{'J'}, binary.BigEndian.AppendUint32(nil, uint32(len(deltaHdr))), deltaHdr, []byte{'F', 0, 0, 0, 0}))

	cases := []badCase{
		{"memory zero", boot("m", "--memory", "0"), 2, "memory size"},
		{"memory negative", boot("m", "--memory", "-1G"), 2, "memory size"},
		{"memory beyond host", boot("m", "--memory", "900G"), 2, "more than this host has"},
		{"memory overflow", boot("m", "--memory", "99999999999999G"), 2, "memory size"},
		{"memory below minimum", boot("m", "--memory", "16M"), 2, "below the minimum"},
		{"cpus zero", boot("c", "--cpus", "0"), 2, "cpus 0 must be from 1 to 64"},
		{"cpus too many", boot("c", "--cpus", "65"), 2, "cpus 65 must be from 1 to 64"},
		{"cpus not a number", boot("c", "--cpus", "two"), 2, `invalid value "two" for flag -cpus`},
		{"host port too big", boot("p", "--port", "70000:22"), 2, `host port "70000" must be a number from 1 to 65535`},
		{"guest port zero", boot("p", "--port", "0"), 2, `guest port "0" must be a number from 1 to 65535`},
		{"port twice", boot("p", "--port", "40022:22", "--port", "40022:80"), 2, "host port 40022 is forwarded twice"},
		{"port empty", boot("p", "--port", ":"), 2, "port forward"},
		{"disk is a text file", boot("d", "--disk", textDisk), 2, "not a whole number of 512-byte sectors"},
		{"disk corrupt qcow2", boot("d", "--disk", badQcow2), 2, "qcow2 magic but its header does not read"},
		{"disk is a directory", boot("d", "--disk", dir), 2, "is not a regular file"},
		{"disk missing", boot("d", "--disk", filepath.Join(dir, "nope.qcow2")), 2, "does not exist"},
		{"disk id twice", boot("d", "--disk", g.Disk, "--disk", "id=data,file="+g.Disk, "--disk", "id=data,file="+g.Disk), 2, `disk id "data" is given twice`},
		{"disk id of the boot disk twice", boot("d", "--disk", "id=os,file="+g.Disk, "--disk", "id=os,file="+g.Disk), 2, `disk id "os" is given twice`},
		{"disk policy unknown", boot("d", "--disk", g.Disk, "--disk", "id=data,file="+g.Disk+",fork=copy"), 2, `disk policy "copy"`},
		{"disk boot disk not cow", boot("d", "--disk", "id=os,file="+g.Disk+",fork=fresh"), 2, `disk "os" is the boot disk, which forks cow, not fresh`},
		{"disk second without id", boot("d", "--disk", g.Disk, "--disk", g.Disk), 2, "a second disk needs an id"},
		{"disk network rbd", boot("d", "--disk", g.Disk, "--disk", "id=data,file=rbd:pool/data"), 2, `disk data "rbd:pool/data" is a network disk (rbd): vmfork forks file and block-device disks only, see docs/ARCHITECTURE.md "Block-device disks"`},
		{"disk network iscsi boot disk", boot("d", "--disk", "iscsi://10.0.0.1/iqn.2001-04.com.example:os/0"), 2, `is a network disk (iscsi)`},
		{"disk network url", boot("d", "--disk", g.Disk, "--disk", "id=data,file=https://example.com/d.qcow2"), 2, `is a network disk (https)`},
		{"disk commit without a machine", []string{"disk", "commit"}, 2, "disk commit needs one machine"},
		{"disk commit of nothing", []string{"disk", "commit", "nope"}, 4, `machine "nope": not found`},
		{"initrd missing", []string{"boot", "i", "--kernel", g.Kernel, "--initrd", filepath.Join(dir, "nope")}, 2, "does not exist"},
		{"initrd without kernel", []string{"boot", "i", "--initrd", g.Initrd, "--disk", g.Disk}, 2, "need --kernel"},
		{"nothing to boot", []string{"boot", "n"}, 2, "a kernel (--kernel) or a disk image (--disk) is required"},
		{"network unknown", boot("n", "--network", "tap"), 2, "want user, bridge=BRIDGE"},
		{"network bridge missing", boot("n", "--network", "bridge=vmfnobr0"), 2, "vmfnobr0"},
		{"network bridge bad name", boot("n", "--network", "bridge=a/b"), 2, "not a valid interface"},
		{"network user with name", boot("n", "--network", "user=x"), 2, "takes no name"},
		{"negative timeout", boot("t", "--timeout", "-5s"), 2, "want a positive duration"},
		{"timeout not a duration", []string{"--timeout", "soon", "ls"}, 2, "soon"},
		{"log level", []string{"--log-level", "loud", "ls"}, 2, "--log-level"},
		{"unknown flag", boot("f", "--bogus"), 2, "flag provided but not defined: -bogus"},
		{"unknown command", []string{"bloot"}, 2, `unknown command "bloot"`},
		{"unknown template command", []string{"template", "svae"}, 2, `unknown command "svae" for "template"`},
		{"unknown help topic", []string{"help", "nosuch"}, 2, "No help topic"},
		{"name with slash", boot("a/b"), 2, `"a/b" is not valid`},
		{"name with space", boot("a b"), 2, `"a b" is not valid`},
		{"name starting with dash", []string{"boot", "--kernel", g.Kernel, "--", "-x"}, 2, `"-x" is not valid`},
		{"two names", []string{"boot", "a", "b", "--kernel", g.Kernel}, 2, "exactly one machine name"},
		{"fork count not a number", []string{"fork", "src", "--count", "abc"}, 2, `invalid value "abc" for flag -count`},
		{"fork of nothing", []string{"fork", "nope"}, 4, `machine "nope": not found`},
		{"fork without source", []string{"fork"}, 2, "source"},
		{"fork disk-only of nothing", []string{"fork", "nope", "--disk-only"}, 4, `machine "nope": not found`},
		{"template save of nothing", []string{"template", "save", "nope", "tpl"}, 4, `"nope": not found`},
		{"template rm of nothing", []string{"template", "rm", "nope"}, 4, "not found"},
		{"template pool of nothing", []string{"template", "pool", "nope", "2"}, 4, "not found"},
		{"template compact of nothing", []string{"template", "compact", "nope"}, 4, `template "nope": not found`},
		{"template compact without a name", []string{"template", "compact"}, 2, "template compact needs a template"},
		{"template compact bad name", []string{"template", "compact", "Bad_Name"}, 2, `"Bad_Name" is not valid`},
		{"logs of nothing", []string{"logs", "nope"}, 4, `machine "nope": not found`},
		{"start of nothing", []string{"start", "nope"}, 4, `machine "nope": not found`},
		{"start without a name", []string{"start"}, 2, "start needs at least one stopped machine"},
		{"start bad name", []string{"start", "Bad_Name"}, 2, `"Bad_Name" is not valid`},
		{"libvirt check two domains", []string{"libvirt", "check", "a", "b"}, 2, "at most one domain name"},
		{"libvirt setup argument", []string{"libvirt", "setup", "x"}, 2, "takes no arguments"},
		// Root's session daemon is no user's: refused before qemu.conf is written.
		{"libvirt setup session as root", []string{"--connect", "qemu:///session", "libvirt", "setup"}, 2, "as root"},
		{"libvirt setup session system flag", []string{"--connect", "qemu:///session", "libvirt", "setup", "--qemu-conf", "/x"}, 2, "--qemu-conf is for qemu:///system"},
		{"qemu binary missing", boot("q", "--qemu", noQEMU), 2, noQEMU + `" (--qemu or VMFORK_QEMU) does not exist`},
		{"qemu binary not executable", boot("q", "--qemu", textDisk), 2, "is not an executable file"},
		{"qemu binary a directory", boot("q", "--qemu", dir), 2, "is a directory"},
		{"qemu binary not on PATH", boot("q", "--qemu", "qemu-system-vmfork-none"), 2, "does not exist"},
		{"mcp without a source", []string{"mcp"}, 2, "--source: name at least one"},
		{"mcp max-children zero", []string{"mcp", "--source", "web", "--max-children", "0"}, 2, "--max-children 0: want 1 to 128"},
		{"mcp ttl above ttl-max", []string{"mcp", "--source", "web", "--ttl", "3h", "--ttl-max", "1h"}, 2, "at most --ttl-max"},
		{"mcp http without a token", []string{"mcp", "--source", "web", "--listen", "127.0.0.1:0"}, 2, "needs a bearer token"},
		{"mcp contract missing", []string{"mcp", "--source", "web", "--contract", filepath.Join(dir, "nope.yaml")}, 2, "--contract"},
		{"overcommit not a ratio", boot("o", "--overcommit", "lots"), 2, `--overcommit "lots": want a ratio above 0`},
		{"overcommit zero", boot("o", "--overcommit", "0"), 2, `--overcommit "0": want a ratio`},
		{"overcommit too big", []string{"--overcommit", "101", "ls"}, 2, `--overcommit "101": want a ratio`},
	}
	runBadCases(t, e, cases, func(t *testing.T) { assertNothingCreated(t, e) })
	runBadCases(t, e.withEnv("VMFORK_OVERCOMMIT=1.5x"), []badCase{
		{"overcommit env not a ratio", boot("o"), 2, `--overcommit "1.5x": want a ratio`},
	}, func(t *testing.T) { assertNothingCreated(t, e) })

	// With a running source: every bad fork, template or exec line is
	// refused before the source pauses; the source keeps running, answers
	// its agent, and nothing beside it appears.
	src := e.boot("src")
	spec := write("spec.yaml", []byte("steps:\n  - name: vmfork.nosuch\n"))
	forkCases := []badCase{
		{"fork count zero", []string{"fork", "src", "--count", "0"}, 2, "--count 0"},
		{"fork count negative", []string{"fork", "src", "--count", "-3"}, 2, "--count -3"},
		{"fork too many", []string{"fork", "src", "--count", "5", "--max-children", "4"}, 2, "4"},
		{"fork bad child name", []string{"fork", "src", "Bad_Name"}, 2, `"Bad_Name" is not valid`},
		{"fork child named as source", []string{"fork", "src", "src"}, 2, "src"},
		{"fork parallel zero", []string{"fork", "src", "--parallel", "0"}, 2, "parallel"},
		{"fork identity unknown", []string{"fork", "src", "--identity", "random"}, 2, "random"},
		{"fork unknown step", []string{"fork", "src", "--skip-step", "vmfork.nosuch"}, 2, "vmfork.nosuch"},
		{"fork step timeout bad", []string{"fork", "src", "--step-timeout", "vmfork.clock=soon"}, 2, "soon"},
		{"fork step timeout negative", []string{"fork", "src", "--step-timeout", "vmfork.clock=-1s"}, 2, "-1s"},
		{"fork static without address", []string{"fork", "src", "--network", "static"}, 2, "address"},
		{"fork bad address", []string{"fork", "src", "--network", "static", "--address", "10.0.0.300/24"}, 2, "10.0.0.300/24"},
		{"fork spec file missing", []string{"fork", "src", "--customize", filepath.Join(dir, "none.yaml")}, 2, "none.yaml"},
		{"fork spec unknown step", []string{"fork", "src", "--customize", spec}, 2, "vmfork.nosuch"},
		{"fork disk policy unknown disk", []string{"fork", "src", "--disk-policy", "nope=fresh"}, 2, `no disk "nope" (the machine's disks: disk0)`},
		{"fork disk policy boot disk", []string{"fork", "src", "--disk-policy", "disk0=keep"}, 2, `disk "disk0" is the boot disk, which forks cow, not keep`},
		{"fork disk policy bad", []string{"fork", "src", "--disk-policy", "disk0"}, 2, "want ID=POLICY"},
		{"disk commit of a machine with no block disk", []string{"disk", "commit", "src"}, 2, `disk commit "src": no disk on a block device (the machine's disks: disk0)`},
		{"disk commit unknown disk", []string{"disk", "commit", "src", "--disk", "nope"}, 2, `no disk "nope"`},
		{"fork bad on-identity-failure", []string{"fork", "src", "--on-identity-failure", "shrug"}, 2, "shrug"},
		{"fork disk-only count zero", []string{"fork", "src", "--disk-only", "--count", "0"}, 2, "--count 0"},
		{"fork crash-consistent without disk-only", []string{"fork", "src", "--crash-consistent"}, 2, "--crash-consistent applies to --disk-only"},
		{"template save bad name", []string{"template", "save", "src", "Bad"}, 2, `"Bad" is not valid`},
		{"template save pool too big", []string{"template", "save", "src", "tpl", "--pool", "100000"}, 2, "pool"},
		{"template pool not a number", []string{"template", "pool", "src", "x"}, 2, "x"},
		{"template push without a host", []string{"template", "push", "src"}, 2, "template push needs a template and a host"},
		{"template push to a host that is not one", []string{"template", "push", "src", "host 2"}, 2, "is not [USER@]HOST[:NAME]"},
		{"template push under a bad name", []string{"template", "push", "src", "host2:Bad"}, 2, `"Bad" is not valid`},
		{"template push with no idle timeout", []string{"template", "push", "src", "host2", "--idle-timeout", "0s"}, 2, "--idle-timeout 0s: must be above 0"},
		{"template push of nothing", []string{"template", "push", "nope", "host2"}, 4, "not found"},
		{"fork --to a host that is not one", []string{"fork", "src", "--to", "host 2"}, 2, "is not [USER@]HOST[:NAME]"},
		{"fork --to a template name", []string{"fork", "src", "--to", "host2:golden"}, 2, "a fork goes to a host"},
		{"fork --to with a local spec file", []string{"fork", "src", "--to", "host2", "--customize", "spec.yaml"}, 2, "--customize cannot be used with --to"},
		{"fork --to with --dry-run", []string{"fork", "src", "--to", "host2", "--dry-run"}, 2, "--dry-run cannot be used with --to"},
		{"fork --to with no idle timeout", []string{"fork", "src", "--to", "host2", "--idle-timeout", "0s"}, 2, "--idle-timeout 0s: must be above 0"},
		{"fork --to with no children", []string{"fork", "src", "--to", "host2", "--count", "0"}, 2, "--count 0: want at least 1"},
		{"fork --to in an unknown mode", []string{"fork", "src", "--to", "host2", "--to-mode", "fast"}, 2, `--to-mode "fast" is not auto, copy or postcopy`},
		{"fork --to postcopy of two children", []string{"fork", "src", "k1", "k2", "--to", "host2", "--to-mode", "postcopy"}, 2, "--to-mode postcopy makes one child"},
		{"fork --to-mode without --to", []string{"fork", "src", "--to-mode", "copy"}, 2, "--to-mode goes with --to"},
		{"fork-serve on a socket not its own", []string{"fork-serve", "--incoming", "/tmp/x.sock", "fork-to-0123456789ab"}, 2, "is not /tmp/vmfork-mig-"},
		{"fork --to of nothing", []string{"fork", "nope", "--to", "host2"}, 4, "not found"},
		{"template pull without a name", []string{"template", "pull", "host2"}, 2, "names no template: give HOST:NAME"},
		{"template pull with an empty name", []string{"template", "pull", "host2:"}, 2, "empty template name"},
		{"template export against an unknown base", []string{"template", "export", "golden-v2", "--base", "golden-old", filepath.Join(dir, "new.vmd")}, 4, `template "golden-old": not found`},
		{"template export against itself", []string{"template", "export", "golden", "--base", "golden", filepath.Join(dir, "new.vmd")}, 2, "the base is the template itself"},
		{"template export --base over a file", []string{"template", "export", "golden", "--base", "old", textDisk}, 2, "a delta archive is not written over a file"},
		{"template import of a delta without its base", []string{"template", "import", delta}, 4, `against template "golden-old" (chunk map sha256 abababababab), which this host does not keep`},
		{"template pull as a bad name", []string{"template", "pull", "host2:golden", "--as", "Bad"}, 2, `"Bad" is not valid`},
		{"exec without command", []string{"exec", "src"}, 2, "needs a machine name and a command"},
		{"start of a running machine", []string{"start", "src"}, 2, `start "src": machine is running already`},
		{"exec bad env", []string{"exec", "src", "--env", "NOEQUALS", "--", "true"}, 2, "NOEQUALS"},
		{"fork qemu binary missing", []string{"fork", "src", "--qemu", noQEMU}, 2, "does not exist"},
		{"template save qemu binary missing", []string{"template", "save", "src", "tpl", "--qemu", noQEMU}, 2, "does not exist"},
		// Admission (issue 29): refused before the source pauses, exit 5.
		{"fork the host has no room for", []string{"fork", "src", "--count", "100", "--overcommit", "0.01"}, 5,
			`fork "src": not enough room: memory: 100 children need about`},
		{"fork dry run the host has no room for", []string{"fork", "src", "--count", "100", "--dry-run", "--overcommit", "0.01"}, 5,
			`fork "src": not enough room: memory: 100 children need about`},
		{"template save with a pool the host has no room for", []string{"template", "save", "src", "tpl", "--pool", "60", "--overcommit", "0.01"}, 5,
			`keep "src": not enough room: memory: 60 pool members`},
		{"fork overcommit bad", []string{"fork", "src", "--overcommit", "-"}, 2, `--overcommit "-"`},
	}
	runBadCases(t, e, forkCases, func(t *testing.T) {
		t.Helper()
		var names []string
		for _, m := range e.list() {
			names = append(names, m.Name)
			if m.Name == "src" && m.State != "running" {
				t.Errorf("source state %q after bad input, want running", m.State)
			}
		}
		if !slices.Equal(names, []string{"src"}) {
			t.Errorf("machines after bad input = %v, want only src", names)
		}
		if tpls, _ := filepath.Glob(filepath.Join(e.stateDir, "templates", "*")); len(tpls) != 0 {
			t.Errorf("bad input left templates %v", tpls)
		}
		if pids := e.qemuProcesses(); !slices.Equal(pids, []int{src.PID}) {
			t.Errorf("QEMU processes = %v, want only the source's %d", pids, src.PID)
		}
	})
	// A paused source's agent does not answer: this proves none was left paused.
	if got := strings.TrimSpace(e.exec("src", "echo", "alive")); got != "alive" {
		t.Errorf("source answered %q after the bad fork lines, want alive", got)
	}

	// A corrupted record is not the user's input: it is refused (exit 1) in
	// one line that names the file, and the record is left for the user.
	rec := filepath.Join(e.stateDir, "machines", "src", "machine.json")
	good, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rec, []byte(`{"name": "src", "spec": `), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"fork", "src"}, {"exec", "src", "--", "true"}, {"stop", "src"}} {
		r := e.vmfork(args...)
		if r.code != 1 || !strings.Contains(r.stderr, rec) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%v with a corrupted machine.json: %s, want exit 1 and one line naming %s", args, r, rec)
		}
	}
	if data, _ := os.ReadFile(rec); string(data) != `{"name": "src", "spec": ` {
		t.Errorf("the corrupted record was rewritten to %q", data)
	}
	if err := os.WriteFile(rec, good, 0o600); err != nil {
		t.Fatal(err)
	}
	e.ok("rm", "src")
}
