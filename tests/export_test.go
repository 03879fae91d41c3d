//go:build integration

package tests

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rewriteArchive writes a copy of template archive in to out, each entry's
// content passed through edit: the way to make an archive that is well
// formed but says something else.
func rewriteArchive(t *testing.T, in, out string, edit func(name string, data []byte) []byte) {
	t.Helper()
	raw, err := exec.Command("zstd", "-d", "-q", "-c", in).Output()
	if err != nil {
		t.Fatalf("zstd -d %s: %v", in, err)
	}
	tr := tar.NewReader(bytes.NewReader(raw))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		data = edit(h.Name, data)
		h.Size = int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(data)
	}
	tw.Close()
	cmd := exec.Command("zstd", "-q", "-c")
	cmd.Stdin = &buf
	z, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, z, 0o600); err != nil {
		t.Fatal(err)
	}
}

// editManifest returns an edit that sets one field of the archived
// template's manifest.
func editManifest(field, value string) func(string, []byte) []byte {
	return func(name string, data []byte) []byte {
		if name != "vmfork-template.json" {
			return data
		}
		var h map[string]any
		if json.Unmarshal(data, &h) != nil {
			return data
		}
		h["template"].(map[string]any)["manifest"].(map[string]any)[field] = value
		out, _ := json.Marshal(h)
		return out
	}
}

// storeIsEmpty fails the test if e's store holds a template, a machine, a
// file in the templates dir or the mem dir, or a QEMU process.
func (e *env) storeIsEmpty(after string) {
	e.t.Helper()
	var left []string
	for _, d := range []string{filepath.Join(e.stateDir, "templates"), filepath.Join(e.stateDir, "machines"), e.memDir} {
		es, _ := os.ReadDir(d)
		for _, x := range es {
			left = append(left, filepath.Join(d, x.Name()))
		}
	}
	if len(left) > 0 || len(e.qemuProcesses()) > 0 {
		e.t.Errorf("after %s: left %v and QEMU processes %v", after, left, e.qemuProcesses())
	}
}

type exportJSON struct {
	ID      string `json:"id"`
	Archive int64  `json:"archive_bytes"`
	Stored  int64  `json:"stored_bytes"`
	Logical int64  `json:"logical_bytes"`
}

type importJSON struct {
	Name      string `json:"name"`
	ID        string `json:"id"`
	Source    string `json:"source"`
	HasMemory bool   `json:"has_memory"`
}

// TestExportImport exports a kept template, gives it up, imports it on a
// second "host" (another state and mem dir) and forks it: the child goes on
// from the saved instant. Archives that are corrupted, truncated or name
// another QEMU version or machine type are refused, leaving nothing.
func TestExportImport(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("src")
	e.exec("src", "vmfork-counter", "start")
	time.Sleep(time.Second)
	e.exec("src", "sh", "-c", "echo saved > /run/at-save; echo on-disk > /data/at-save; sync")
	before := e.counter("src")
	e.ok("template", "save", "src", "golden")
	file := filepath.Join(t.TempDir(), "golden.vmt")
	var ex exportJSON
	e.jsonOK(&ex, "template", "export", "golden", file)
	st, err := os.Stat(file)
	if err != nil || st.Size() != ex.Archive {
		t.Fatalf("archive %s: %v, size differs from %+v", file, err, ex)
	}
	// Untouched guest RAM is not stored, and what is stored is compressed.
	if ex.Stored >= ex.Logical || ex.Archive >= ex.Stored {
		t.Errorf("export %+v: want archive < stored < logical bytes", ex)
	}
	e.ok("template", "rm", "golden")
	e.ok("rm", "src", "--force")

	host := newEnv(t)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bad := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(bad, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flipped := bytes.Clone(data)
	flipped[len(flipped)/2] ^= 0x01
	payload := filepath.Join(bad, "payload.vmt")
	rewriteArchive(t, file, payload, func(name string, b []byte) []byte {
		if name == "files/devstate" {
			b[len(b)/2] ^= 0x01
		}
		return b
	})
	oldQEMU := filepath.Join(bad, "qemu.vmt")
	rewriteArchive(t, file, oldQEMU, editManifest("qemu_version", "6.2.0"))
	otherMachine := filepath.Join(bad, "machine.vmt")
	rewriteArchive(t, file, otherMachine, editManifest("machine_type", "pc-q35-9.9"))
	for _, c := range []struct{ name, file, want string }{
		{"a flipped byte", write("flipped.vmt", flipped), "corrupted"},
		{"a flipped payload byte", payload, "archive file devstate: sha256"},
		{"a truncated archive", write("short.vmt", data[:len(data)*3/5]), "truncated"},
		{"another QEMU version", oldQEMU, `QEMU version "6.2.0"`},
		{"another machine type", otherMachine, `machine type "pc-q35-9.9"`},
	} {
		r := host.vmfork("template", "import", c.file, "--as", "golden2")
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("import of %s: %s, want a refusal saying %q", c.name, r, c.want)
		}
		host.storeIsEmpty("the import of " + c.name)
	}
	var im importJSON
	host.jsonOK(&im, "template", "import", file, "--as", "golden2")
	if im.Name != "golden2" || im.Source != "src" || !im.HasMemory {
		t.Fatalf("import = %+v", im)
	}
	host.ok("fork", "golden2", "kid")
	if got := host.exec("kid", "cat", "/run/at-save", "/data/at-save"); got != "saved\non-disk\n" {
		t.Errorf("kid: files of the saved instant = %q", got)
	}
	if n := host.counter("kid"); n < before {
		t.Errorf("kid: counter %d, want it to go on from %d (the save)", n, before)
	}
	// The imported chain is the host's own: nothing names the first store.
	for _, f := range []string{"machines/kid/machine.json", "templates/" + im.ID + "/manifest.json"} {
		b, err := os.ReadFile(filepath.Join(host.stateDir, f))
		if err != nil || bytes.Contains(b, []byte(e.stateDir)) {
			t.Errorf("%s names the exporting store %s (%v)", f, e.stateDir, err)
		}
	}
	host.ok("rm", "kid", "--force")
	host.ok("template", "rm", "golden2")
	host.storeIsEmpty("rm of the imported template and its child")
}

// TestKeptTemplateOfStoppedMachine keeps a stopped machine's disk as a
// template; its children boot fresh from it, with identities of their own,
// and each writes to a copy-on-write overlay of its own.
func TestKeptTemplateOfStoppedMachine(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	src := e.boot("src")
	e.exec("src", "sh", "-c", "echo on-disk > /data/at-save; sync")
	e.ok("stop", "src")
	var saved templateJSON
	e.jsonOK(&saved, "template", "save", "src", "disk")
	if saved.Name != "disk" || saved.HasMemory {
		t.Fatalf("template save of a stopped machine = %+v, want disk only", saved)
	}
	var res forkJSON
	e.jsonOK(&res, "fork", "disk", "--count", "2")
	if len(res.Children) != 2 {
		t.Fatalf("fork disk = %+v, want 2 children", res)
	}
	macs := map[string]bool{src.MAC: true}
	for _, m := range e.list() {
		if m.Parent == "src" && m.Template == saved.ID {
			macs[m.MAC] = true
			if got := e.exec(m.Name, "cat", "/data/at-save"); got != "on-disk\n" {
				t.Errorf("%s: /data/at-save = %q", m.Name, got)
			}
			// Booted fresh: nothing of the source's last run is in RAM.
			if r := e.vmfork("exec", m.Name, "--", "cat", "/run/counter"); r.code == 0 {
				t.Errorf("%s has the source's RAM", m.Name)
			}
		}
	}
	if len(macs) != 3 {
		t.Errorf("MACs of source and children %v, want 3 different", macs)
	}
	e.exec(res.Children[0].Name, "sh", "-c", "echo child > /data/at-save; sync")
	if got := e.exec(res.Children[1].Name, "cat", "/data/at-save"); got != "on-disk\n" {
		t.Errorf("%s sees its sibling's write: %q", res.Children[1].Name, got)
	}
}

// waitCounter waits until name's counter reaches at least n.
func (e *env) waitCounter(name string, n int) int {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		c := e.counter(name)
		if c >= n {
			return c
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: counter %d has not reached %d", name, c, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestCheckpointRewind: a machine whose counter ran on, rewound to a
// checkpoint, shows the checkpoint's state again (RAM and disk), with its
// name and MAC unchanged; a second rewind to the same checkpoint works; a
// checkpoint of another machine is refused without --force.
func TestCheckpointRewind(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("src")
	e.boot("other")
	e.exec("src", "vmfork-counter", "start")
	e.waitCounter("src", 5)
	before := e.machine("src")
	guestID := func() string {
		return e.exec("src", "sh", "-c", "hostname; cat /sys/class/net/e*/address /etc/machine-id")
	}
	id := guestID()
	c0 := e.counter("src")
	var cp templateJSON
	e.jsonOK(&cp, "checkpoint", "src", "--as", "cp1")
	if cp.Name != "cp1" || cp.Source != "src" || !cp.HasMemory {
		t.Fatalf("checkpoint = %+v", cp)
	}
	c1 := e.counter("src")
	var cps []templateJSON
	e.jsonOK(&cps, "checkpoint", "ls", "src")
	if len(cps) != 1 || cps[0].Name != "cp1" {
		t.Errorf("checkpoint ls src = %+v", cps)
	}
	for round := 1; round <= 2; round++ {
		e.exec("src", "sh", "-c", "echo later > /run/after-cp; echo later > /data/after-cp; sync")
		later := e.waitCounter("src", c1+60)
		var rw struct {
			Name string `json:"name"`
			PID  int    `json:"pid"`
		}
		e.jsonOK(&rw, "rewind", "src", "--to", "cp1")
		if n := e.counter("src"); n < c0 || n >= later {
			t.Errorf("round %d: counter %d after the rewind, want it back near the checkpoint's %d..%d (it was %d)", round, n, c0, c1, later)
		}
		for _, f := range []string{"/run/after-cp", "/data/after-cp"} {
			if r := e.vmfork("exec", "src", "--", "cat", f); r.code == 0 {
				t.Errorf("round %d: %s written after the checkpoint is still there", round, f)
			}
		}
		if got := guestID(); got != id {
			t.Errorf("round %d: the guest's hostname, MAC and machine-id are %q after the rewind, were %q", round, got, id)
		}
		m := e.machine("src")
		if m.Name != "src" || m.MAC != before.MAC || m.State != "running" || m.PID != rw.PID || m.PID == before.PID {
			t.Errorf("round %d: after the rewind %+v, before %+v: want the same name and MAC, a new process", round, m, before)
		}
	}
	r := e.vmfork("rewind", "other", "--to", "cp1")
	if r.code != 2 || !strings.Contains(r.stderr, "--force") {
		t.Errorf("rewind of another machine to src's checkpoint: %s, want exit 2 naming --force", r)
	}
	e.exec("other", "true")
}
