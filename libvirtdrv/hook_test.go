package libvirtdrv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConf(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "qemu.conf")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMemoryBackingDir(t *testing.T) {
	cases := []struct{ conf, want string }{
		{"", defaultMemoryBackingDir},
		{"#memory_backing_dir = \"/var/lib/libvirt/qemu/ram\"\n", defaultMemoryBackingDir},
		{"memory_backing_dir = \"/dev/shm\"\n", "/dev/shm/libvirt/qemu"},
		{"memory_backing_dir = \"/a\"\nmemory_backing_dir = \"/b/\"  # the last one wins\n", "/b/libvirt/qemu"},
	}
	for _, c := range cases {
		got, err := MemoryBackingDir(writeConf(t, c.conf))
		if err != nil || got != c.want {
			t.Errorf("MemoryBackingDir(%q) = %q, %v, want %q", c.conf, got, err, c.want)
		}
	}
	if got, err := MemoryBackingDir(filepath.Join(t.TempDir(), "none")); err != nil || got != defaultMemoryBackingDir {
		t.Errorf("missing qemu.conf: %q, %v, want libvirt's default", got, err)
	}
}

// hookEnv is a fake host: a qemu.conf whose memory_backing_dir is a temp
// dir, the RAM directory libvirt would have made for domain id 7, and a
// template file.
func hookEnv(t *testing.T) (conf, ramDir, template string) {
	t.Helper()
	base := t.TempDir()
	conf = writeConf(t, "memory_backing_dir = \""+base+"\"\n")
	ramDir = filepath.Join(base, "libvirt", "qemu", "7-web-1")
	if err := os.MkdirAll(ramDir, 0o700); err != nil {
		t.Fatal(err)
	}
	template = filepath.Join(base, "web.1.ram")
	if err := os.WriteFile(template, []byte("frozen"), 0o600); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(base, "state", "templates", "web.1")
	if err := os.MkdirAll(record, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(record, "manifest.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	return conf, ramDir, template
}

// childMetadata is the metadata of fork child web-1 of template web.1 in
// hookEnv's state dir, with template RAM file ram.
func childMetadata(template, ram string) *Metadata {
	state := filepath.Join(filepath.Dir(template), "state")
	return &Metadata{Machine: "web-1", MachineDir: filepath.Join(state, "machines", "web-1"), Template: "web.1", TemplateRAM: ram}
}

func domainXMLWith(md *Metadata) string {
	x := "<domain type='qemu' id='7'><name>web-1</name>"
	if md != nil {
		x += "<metadata>" + md.element() + "</metadata>"
	}
	return x + "</domain>"
}

func TestHookLinksTemplate(t *testing.T) {
	conf, ramDir, template := hookEnv(t)
	x := domainXMLWith(childMetadata(template, template))
	if err := Hook([]string{"web-1", "start", "begin", "-"}, strings.NewReader(x), HookOptions{QEMUConf: conf}); err != nil {
		t.Fatal(err)
	}
	ram := filepath.Join(ramDir, "pc.ram")
	if !linkedTo(ram, template) {
		t.Errorf("%s is not a link to %s", ram, template)
	}
	// libvirt runs the hook again on a restart of the same id: still fine.
	if err := Hook([]string{"web-1", "start", "begin", "-"}, strings.NewReader(x), HookOptions{QEMUConf: conf}); err != nil {
		t.Errorf("second run: %v", err)
	}
}

func TestHookLeavesOthersAlone(t *testing.T) {
	conf, ramDir, template := hookEnv(t)
	child := domainXMLWith(childMetadata(template, template))
	cases := []struct {
		name string
		args []string
		xml  string
	}{
		{"not vmfork's", []string{"web-1", "start", "begin", "-"}, domainXMLWith(nil)},
		{"a booted machine", []string{"web-1", "start", "begin", "-"}, domainXMLWith(&Metadata{Machine: "web-1"})},
		{"prepare", []string{"web-1", "prepare", "begin", "-"}, child},
		{"release", []string{"web-1", "release", "end", "-"}, child},
		// Remapped onto the template by vmfork: nothing to link.
		{"a remapped child", []string{"web-1", "start", "begin", "-"},
			domainXMLWith(&Metadata{Machine: "web-1", MachineDir: filepath.Join(filepath.Dir(template), "state", "machines", "web-1"), Template: "web.1", MappedRAM: template})},
		// Mapped shared, a linked template would be written by the child.
		{"a child mapping its RAM shared", []string{"web-1", "start", "begin", "-"},
			strings.Replace(child, "</domain>", "<memoryBacking><source type='file'/><access mode='shared'/></memoryBacking></domain>", 1)},
	}
	for _, c := range cases {
		if err := Hook(c.args, strings.NewReader(c.xml), HookOptions{QEMUConf: conf}); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if _, err := os.Lstat(filepath.Join(ramDir, "pc.ram")); err == nil {
			t.Errorf("%s: the hook linked RAM", c.name)
		}
	}
}

func TestHookFailsLoudly(t *testing.T) {
	conf, ramDir, template := hookEnv(t)
	// A wrong memory_backing_dir (libvirtd not restarted after a change)
	// must fail the start, never start a child on zeroed RAM.
	other := writeConf(t, "memory_backing_dir = \""+t.TempDir()+"\"\n")
	x := domainXMLWith(childMetadata(template, template))
	if err := Hook([]string{"web-1", "start", "begin", "-"}, strings.NewReader(x), HookOptions{QEMUConf: other}); err == nil || !strings.Contains(err.Error(), "RAM directory") {
		t.Errorf("hook with the wrong RAM dir: err = %v, want one naming the RAM directory", err)
	}
	os.Rename(template, template+".gone")
	if err := Hook([]string{"web-1", "start", "begin", "-"}, strings.NewReader(x), HookOptions{QEMUConf: conf}); err == nil {
		t.Errorf("hook with a missing template: no error")
	}
	// Only a template's RAM file is ever linked as guest RAM.
	secret := filepath.Join(filepath.Dir(template), "secret")
	os.WriteFile(secret, []byte("x"), 0o600)
	for _, md := range []*Metadata{childMetadata(template, secret), {Machine: "web-1", MachineDir: "/nowhere/machines/web-1", Template: "web.1", TemplateRAM: template + ".gone"}} {
		if err := Hook([]string{"web-1", "start", "begin", "-"}, strings.NewReader(domainXMLWith(md)), HookOptions{QEMUConf: conf}); err == nil {
			t.Errorf("hook linked %s for %+v", md.TemplateRAM, md)
		}
	}
	if _, err := os.Lstat(filepath.Join(ramDir, "pc.ram")); err == nil {
		t.Errorf("a failed hook left a RAM link")
	}
}

func TestHookReapsReleasedChild(t *testing.T) {
	var got []ReapRequest
	opt := HookOptions{Reap: func(r ReapRequest) error { got = append(got, r); return nil }}
	md := Metadata{Machine: "web-1", MachineDir: "/var/lib/vmfork/machines/web-1", TemplateRAM: "/dev/shm/vmfork/web.1.ram", URI: "qemu:///system"}
	x := strings.Replace(domainXMLWith(&md), "<name>", "<uuid>0b6f1c2e-8f0a-4c55-9d1e-1c2b3a4d5e6f</uuid><name>", 1)
	if err := Hook([]string{"web-1", "release", "end", "-"}, strings.NewReader(x), opt); err != nil {
		t.Fatal(err)
	}
	want := ReapRequest{URI: "qemu:///system", StateDir: "/var/lib/vmfork", MemDir: "/dev/shm/vmfork", Machine: "web-1", UUID: "0b6f1c2e-8f0a-4c55-9d1e-1c2b3a4d5e6f"}
	if len(got) != 1 || got[0] != want {
		t.Errorf("reap requests = %+v, want [%+v]", got, want)
	}
	// A child remapped onto its template is reaped the same way.
	md.MappedRAM, md.TemplateRAM = md.TemplateRAM, ""
	mapped := strings.Replace(domainXMLWith(&md), "<name>", "<uuid>0b6f1c2e-8f0a-4c55-9d1e-1c2b3a4d5e6f</uuid><name>", 1)
	if err := Hook([]string{"web-1", "release", "end", "-"}, strings.NewReader(mapped), opt); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1] != want {
		t.Errorf("reap requests of a remapped child = %+v, want [%+v]", got[1:], want)
	}
	got = nil
	booted := domainXMLWith(&Metadata{Machine: "web", MachineDir: "/var/lib/vmfork/machines/web"})
	for _, c := range []struct{ op, xml string }{{"release", booted}, {"stopped", x}} {
		if err := Hook([]string{"web-1", c.op, "end", "-"}, strings.NewReader(c.xml), opt); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 0 {
		t.Errorf("reaped %+v: only a fork child's release reaps", got)
	}
}

type fakeDaemon struct{ reloads, restarts int }

func (f *fakeDaemon) Reload(context.Context) error  { f.reloads++; return nil }
func (f *fakeDaemon) Restart(context.Context) error { f.restarts++; return nil }

func TestSetupIsIdempotent(t *testing.T) {
	if !onTmpfs("/dev/shm") {
		t.Skip("/dev/shm is not a tmpfs here")
	}
	hookDir := filepath.Join(t.TempDir(), "qemu.d")
	diskDir := t.TempDir() // not a tmpfs: setup must move RAM to one
	conf := writeConf(t, "# qemu.conf\nmemory_backing_dir = \""+diskDir+"\"\n")
	daemon := &fakeDaemon{}
	opt := SetupOptions{HookDir: hookDir, QEMUConf: conf, Binary: "/usr/bin/vmfork", MemoryBackingDir: "/dev/shm", Daemon: daemon,
		KVMDevice: filepath.Join(t.TempDir(), "no-kvm")}

	dry := opt
	dry.DryRun = true
	res, err := Setup(t.Context(), dry)
	if err != nil || !res.Changed || len(res.Changes) != 2 || daemon.restarts+daemon.reloads != 0 {
		t.Fatalf("dry run = %+v, %v, daemon %+v: want two changes reported and none made", res, err, daemon)
	}
	if _, err := os.Stat(filepath.Join(hookDir, HookName)); err == nil {
		t.Fatalf("dry run installed the hook")
	}

	res, err = Setup(t.Context(), opt)
	if err != nil || !res.Changed || res.Libvirtd != "restarted" || daemon.restarts != 1 {
		t.Fatalf("first run = %+v, %v, daemon %+v: want changes and one restart", res, err, daemon)
	}
	if res.MemoryBackingDir != "/dev/shm/libvirt/qemu" {
		t.Errorf("memory_backing_dir = %q, want /dev/shm/libvirt/qemu", res.MemoryBackingDir)
	}
	st, err := os.Stat(filepath.Join(hookDir, HookName))
	if err != nil || st.Mode().Perm()&0o111 == 0 {
		t.Errorf("hook not installed executable: %v", err)
	}
	data, _ := os.ReadFile(conf)
	if !strings.Contains(string(data), "#memory_backing_dir = \""+diskDir+"\"") {
		t.Errorf("the old setting is not kept commented out:\n%s", data)
	}

	res, err = Setup(t.Context(), opt)
	if err != nil || res.Changed || len(res.Changes) != 0 || res.Libvirtd != "unchanged" || daemon.restarts != 1 || daemon.reloads != 0 {
		t.Errorf("second run = %+v, %v, daemon %+v: want nothing changed", res, err, daemon)
	}

	// A moved binary: only the hook changes, and libvirtd is reloaded.
	opt.Binary = "/opt/vmfork"
	res, err = Setup(t.Context(), opt)
	if err != nil || len(res.Changes) != 1 || res.Libvirtd != "reloaded" || daemon.reloads != 1 {
		t.Errorf("run with a new binary = %+v, %v, daemon %+v: want the hook rewritten and a reload", res, err, daemon)
	}
}
