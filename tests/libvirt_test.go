//go:build integration

package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestLibvirtForkIntoDomains forks a libvirt parent into three children that
// are ordinary libvirt domains, and removes them the two ways an operator
// would: virsh destroy and vmfork rm. Either way nothing is left, and the
// template goes with the last child.
func TestLibvirtForkIntoDomains(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	p := d.n("p")
	kids := []string{p + "-1", p + "-2", p + "-3"}
	d.bootGuest(p)
	pid := strings.TrimSpace(d.run(p, "vmfork-counter", "start"))
	time.Sleep(time.Second)
	before := d.count(p)
	var res forkJSON
	d.cliJSON(&res, "fork", p, "--count", "3")
	if len(res.Children) != 3 {
		t.Fatalf("fork = %+v, want three children", res)
	}

	running := strings.Fields(virshOK(t, "list", "--name", "--state-running"))
	genids := map[string]string{}
	for _, n := range append([]string{p}, kids...) {
		if !contains(running, n) {
			t.Errorf("virsh list does not show %s running: %v", n, running)
		}
		g := genidOf(t, n)
		if other, dup := genids[g]; dup || g == "" {
			t.Errorf("%s has vmgenid %q, as %s does", n, g, other)
		}
		genids[g] = n
	}
	for _, k := range kids {
		if got := strings.TrimSpace(d.run(k, "cat", "/run/counter.pid")); got != pid {
			t.Errorf("%s: counter pid %s, want the parent's %s", k, got, pid)
		}
		if c := d.count(k); c < before {
			t.Errorf("%s: counter %d, want it to continue from %d", k, c, before)
		}
		// A console libvirt knows: what `virsh console` attaches to.
		if tty := strings.TrimSpace(virshOK(t, "ttyconsole", k)); !strings.HasPrefix(tty, "/dev/pts/") {
			t.Errorf("%s: virsh ttyconsole = %q, want a pty", k, tty)
		}
		x := virshOK(t, "dumpxml", k)
		if !strings.Contains(x, "<vmfork:parent>"+p+"</vmfork:parent>") || !strings.Contains(x, "<vmfork:template>"+res.Template+"</vmfork:template>") {
			t.Errorf("%s: domain XML lacks vmfork's parent and template metadata", k)
		}
	}

	tplDir := filepath.Join(d.stateDir, "templates", res.Template)
	tplRAM := filepath.Join(d.memDir, res.Template+".ram")
	gone := func(n string) func() bool {
		return func() bool {
			_, listed := d.machines()[n]
			return !listed && !exists(filepath.Join(d.stateDir, "machines", n)) && len(domains(t, n)) == 0
		}
	}
	// virsh destroy: the domain ends, and the release hook has vmfork forget
	// the child.
	virshOK(t, "destroy", kids[0])
	if !eventually(30*time.Second, gone(kids[0])) {
		t.Errorf("%s not cleaned up after virsh destroy: ls %v", kids[0], d.machines())
	}
	d.cliOK("rm", kids[1])
	if !gone(kids[1])() {
		t.Errorf("%s not cleaned up after vmfork rm", kids[1])
	}
	if !exists(tplRAM) || !exists(tplDir) {
		t.Fatalf("template %s went while %s still maps it", res.Template, kids[2])
	}
	d.run(kids[2], "true")
	// The last child goes with virsh destroy: the template goes with it.
	virshOK(t, "destroy", kids[2])
	if !eventually(30*time.Second, func() bool { return gone(kids[2])() && !exists(tplDir) && !exists(tplRAM) }) {
		t.Errorf("after the last child's virsh destroy: template dir %v, RAM %v, machines %v", exists(tplDir), exists(tplRAM), d.machines())
	}
	for _, k := range kids {
		if dirs, _ := filepath.Glob("/dev/shm/libvirt/qemu/*-" + k); len(dirs) != 0 {
			t.Errorf("libvirt RAM directory left: %v", dirs)
		}
	}

	c := d.count(p)
	time.Sleep(1200 * time.Millisecond)
	if got := d.count(p); got <= c {
		t.Errorf("parent counter stuck at %d", got)
	}
	d.cliOK("rm", p)
	if left := d.leftovers(); len(left) != 0 {
		t.Errorf("left after rm: %v", left)
	}
}

// TestLibvirtCheck defines domains the way an operator might have and checks
// that vmfork names the XML element that keeps each from being forked.
func TestLibvirtCheck(t *testing.T) {
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	g := d.guest
	define := func(name, memoryBacking, balloon string) string {
		x := `<domain type='qemu'><name>` + name + `</name><memory unit='MiB'>128</memory><vcpu>1</vcpu>` + memoryBacking +
			`<genid/><os><type arch='x86_64' machine='q35'>hvm</type><kernel>` + g.Kernel + `</kernel></os><devices>` + balloon +
			`<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel></devices></domain>`
		f := filepath.Join(t.TempDir(), name+".xml")
		if err := os.WriteFile(f, []byte(x), 0o600); err != nil {
			t.Fatal(err)
		}
		virshOK(t, "define", f)
		return name
	}
	shared := "<memoryBacking><source type='file'/><access mode='shared'/></memoryBacking>"
	cases := []struct {
		name string
		dom  string
		says []string
	}{
		{"anonymous RAM", define(d.n("anon"), "", "<memballoon model='none'/>"), []string{"<memoryBacking><source type='file'/>"}},
		{"balloon", define(d.n("balloon"), shared, "<memballoon model='virtio'/>"), []string{"<memballoon model='virtio'>"}},
		{"defaults", define(d.n("plain"), "", ""), []string{"<memoryBacking><source type='file'/>", "<memballoon model='virtio'>"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := d.cli("libvirt", "check", c.dom)
			if r.code != 1 {
				t.Errorf("check %s: %s, want exit 1", c.dom, r)
			}
			for _, el := range c.says {
				if !strings.Contains(r.stderr, el) {
					t.Errorf("check %s: stderr %q does not name %s", c.dom, r.stderr, el)
				}
			}
			r = d.cli("libvirt", "check", "--json", c.dom)
			var out struct {
				Forkable bool `json:"forkable"`
				Problems []struct {
					Element string `json:"element"`
				} `json:"problems"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Forkable || len(out.Problems) != len(c.says) {
				t.Errorf("check %s --json = %q (%v), want not forkable with %d problems", c.dom, r.stdout, err, len(c.says))
			}
		})
	}
	ok := define(d.n("ok"), shared, "<memballoon model='none'/>")
	if r := d.cliOK("libvirt", "check", ok); !strings.Contains(r.stdout, "can be forked") {
		t.Errorf("check of a forkable domain: %s", r)
	}
	if r := d.cli("libvirt", "check", d.n("nope")); r.code != 4 {
		t.Errorf("check of a missing domain: %s, want exit 4", r)
	}
}

// TestLibvirtSetupIdempotent runs setup again: nothing is left to change.
func TestLibvirtSetupIdempotent(t *testing.T) {
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	var res struct {
		Changed bool     `json:"changed"`
		Changes []string `json:"changes"`
	}
	// Twice here: another test binary on the host (another checkout's
	// tests) may have installed its own vmfork in the hook since this
	// binary's first setup; the first run here takes it back.
	d.cliJSON(&res, "libvirt", "setup")
	d.cliJSON(&res, "libvirt", "setup")
	if res.Changed || len(res.Changes) != 0 {
		t.Errorf("second setup changed %v", res.Changes)
	}
}

var genidPattern = regexp.MustCompile(`<genid>([0-9a-f-]+)</genid>`)

func genidOf(t *testing.T, domain string) string {
	t.Helper()
	m := genidPattern.FindStringSubmatch(virshOK(t, "dumpxml", domain))
	if m == nil {
		t.Errorf("%s has no <genid>", domain)
		return ""
	}
	return m[1]
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// TestLibvirtKeptTemplate keeps a libvirt machine's instant and forks
// libvirt domains from it later. The libvirt driver has no warm pool: asking
// for one is refused before anything is paused.
func TestLibvirtKeptTemplate(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	p, gold := d.n("p"), d.n("gold")
	d.bootGuest(p)
	d.run(p, "sh", "-c", "echo kept > /run/mark")
	if r := d.cli("template", "save", p, gold, "--pool", "1"); r.code == 0 || !strings.Contains(r.stderr, "no warm pool") {
		t.Errorf("template save --pool on libvirt: %s, want a refusal naming the pool", r)
	}
	var saved templateJSON
	d.cliJSON(&saved, "template", "save", p, gold)
	if saved.Name != gold || !saved.HasMemory {
		t.Fatalf("template save = %+v", saved)
	}
	d.run(p, "sh", "-c", "echo later > /run/mark")
	var res forkJSON
	d.cliJSON(&res, "fork", gold, "--count", "2")
	if len(res.Children) != 2 || res.Template != saved.ID {
		t.Fatalf("fork of the kept template = %+v", res)
	}
	running := strings.Fields(virshOK(t, "list", "--name", "--state-running"))
	for _, c := range res.Children {
		if !contains(running, c.Name) {
			t.Errorf("virsh list does not show %s running: %v", c.Name, running)
		}
		if got := d.run(c.Name, "cat", "/run/mark"); got != "kept\n" {
			t.Errorf("%s: /run/mark = %q, want the kept instant's", c.Name, got)
		}
	}
	d.cliOK("template", "rm", gold)
	d.cliOK("rm", res.Children[0].Name, res.Children[1].Name, p)
	if left := d.leftovers(); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(d.stateDir, "templates", "*")); len(left) != 0 {
		t.Errorf("templates left: %v", left)
	}
}
