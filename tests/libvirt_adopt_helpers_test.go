//go:build integration

package tests

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Memory and balloon settings of an operator's domain.
const (
	sharedFileRAM = "<memoryBacking><source type='file'/><access mode='shared'/></memoryBacking>"
	noBalloon     = "<memballoon model='none'/>"
)

// operatorXML is a domain as an operator would define it with virsh for the
// test guest: no vmfork metadata and libvirt's default seclabel (QEMU runs
// as libvirt-qemu, with the image files relabelled for it). disk may be
// empty.
func operatorXML(name string, g guest, disk, memoryBacking, balloon string) string {
	x := `<domain type='qemu'>
  <name>` + name + `</name>
  <memory unit='MiB'>256</memory>
  <genid/>
  ` + memoryBacking + `
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>` + g.Kernel + `</kernel>
    <initrd>` + g.Initrd + `</initrd>
    <cmdline>console=ttyS0 quiet panic=-1</cmdline>
  </os>
  <!-- TCG reserves 1 GiB of translation cache per QEMU by default. -->
  <features><acpi/><apic/><tcg><tb-cache unit='MiB'>128</tb-cache></tcg></features>
  <cpu mode='custom' match='exact'><model fallback='forbid'>qemu64</model></cpu>
  <devices>
`
	if disk != "" {
		x += `    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='` + disk + `'/><target dev='vda' bus='virtio'/></disk>
`
	}
	return x + `    <interface type='user'><model type='virtio'/></interface>
    <serial type='pty'/>
    <console type='pty'/>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    ` + balloon + `
  </devices>
</domain>
`
}

// defineDomain defines domain x with virsh, and starts it unless stopped.
// newDriverEnv's cleanup destroys and undefines it.
func defineDomain(t *testing.T, name, x string, start bool) {
	t.Helper()
	f := filepath.Join(t.TempDir(), name+".xml")
	if err := os.WriteFile(f, []byte(x), 0o644); err != nil {
		t.Fatal(err)
	}
	virshOK(t, "define", f)
	if start {
		virshOK(t, "start", name)
	}
}

// reachableByQEMU gives the test's temp root (the parent of t.TempDir()'s
// directories, made 0700 by the testing package) search permission for
// others, as /var/lib has on a real host: a domain's QEMU runs as
// libvirt-qemu and must reach the images below it.
func reachableByQEMU(t *testing.T, root string) {
	t.Helper()
	st, err := os.Stat(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, st.Mode().Perm()|0o011); err != nil {
		t.Fatal(err)
	}
}

// dumpxml returns domain name's live definition, or its persistent one.
func dumpxml(t *testing.T, name string, inactive bool) string {
	t.Helper()
	if inactive {
		return virshOK(t, "dumpxml", "--inactive", name)
	}
	return virshOK(t, "dumpxml", name)
}

// userImage makes an operator's disk image in dir: a qcow2 overlay on the
// test guest's data disk.
func userImage(t *testing.T, g guest, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "web.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", g.Disk, "-F", "qcow2", p).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	return p
}

// agentRun runs argv in domain name through its guest agent with virsh (the
// domain is not vmfork's yet) and returns its stdout; it fails the test
// unless the command exits 0.
func agentRun(t *testing.T, name string, argv ...string) string {
	t.Helper()
	req, _ := json.Marshal(map[string]any{"execute": "guest-exec", "arguments": map[string]any{
		"path": argv[0], "arg": argv[1:], "capture-output": true}})
	var started struct {
		Return struct {
			PID int `json:"pid"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(virshOK(t, "qemu-agent-command", name, string(req))), &started); err != nil {
		t.Fatalf("guest-exec %v: %v", argv, err)
	}
	status, _ := json.Marshal(map[string]any{"execute": "guest-exec-status", "arguments": map[string]int{"pid": started.Return.PID}})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var st struct {
			Return struct {
				Exited   bool   `json:"exited"`
				ExitCode int    `json:"exitcode"`
				Out      string `json:"out-data"`
			} `json:"return"`
		}
		if err := json.Unmarshal([]byte(virshOK(t, "qemu-agent-command", name, string(status))), &st); err != nil {
			t.Fatalf("guest-exec-status %v: %v", argv, err)
		}
		if st.Return.Exited {
			out, _ := base64.StdEncoding.DecodeString(st.Return.Out)
			if st.Return.ExitCode != 0 {
				t.Fatalf("%s in %s: exit %d: %s", strings.Join(argv, " "), name, st.Return.ExitCode, out)
			}
			return string(out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s in %s did not exit", strings.Join(argv, " "), name)
	return ""
}

// waitAgent waits until the guest agent of domain name answers.
func waitAgent(t *testing.T, name string) {
	t.Helper()
	ping := func() bool {
		_, err := virsh(t, "qemu-agent-command", name, `{"execute":"guest-ping"}`)
		return err == nil
	}
	if !eventually(3*time.Minute, ping) {
		t.Fatalf("the guest agent of %s does not answer", name)
	}
}

// links returns path's hard-link count.
func links(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(st.Sys().(*syscall.Stat_t).Nlink)
}

// backingOf returns the backing file qcow2 image path names.
func backingOf(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", path).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", path, err)
	}
	var info struct {
		Backing string `json:"backing-filename"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	return info.Backing
}

// readJSONFile decodes the JSON file at path into v.
func readJSONFile(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// adoptedRecord is what the tests read of an adopted machine's record.
type adoptedRecord struct {
	Paths struct {
		Disk string `json:"disk"`
	} `json:"paths"`
	Adopted *struct {
		ID   string `json:"id"`
		Disk string `json:"disk"`
	} `json:"adopted"`
}

// templateRecord is what the tests read of a template's record.
type templateRecord struct {
	Paths struct {
		Disk string `json:"disk"`
	} `json:"paths"`
	ForeignDisk bool `json:"foreign_disk"`
}
