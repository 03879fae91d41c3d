//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The Ansible collection (ansible/) driven by a real ansible-playbook
// (Debian 12's ansible-core 2.14) against localhost, with the collection
// linked as ansible_collections/vmfork/vmfork in a temp dir.

// playbookTimeout bounds one ansible-playbook run: boots and forks under TCG
// on a loaded host.
const playbookTimeout = 8 * time.Minute

type ansible struct {
	t    *testing.T
	e    *env
	dir  string // ANSIBLE_COLLECTIONS_PATH, playbooks, ansible's own temp files
	vars map[string]any
}

func newAnsible(t *testing.T, e *env) *ansible {
	t.Helper()
	if _, err := exec.LookPath("ansible-playbook"); err != nil {
		t.Fatalf("ansible-playbook not found (scripts/deps.sh installs ansible-core): %v", err)
	}
	coll, err := filepath.Abs(filepath.Join("..", "ansible"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "ansible_collections", "vmfork"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(coll, filepath.Join(dir, "ansible_collections", "vmfork", "vmfork")); err != nil {
		t.Fatal(err)
	}
	return &ansible{t: t, e: e, dir: dir, vars: map[string]any{
		"vmfork_bin": e.bin, "vmfork_state": e.stateDir, "vmfork_mem": e.memDir,
	}}
}

// recap is one host's PLAY RECAP counts.
type recap struct{ ok, changed, unreachable, failed int }

var recapLine = regexp.MustCompile(`(?m)^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)`)

// play writes playbook text as NAME.yml and runs it with the vars and extra
// arguments; it returns the recap by host and the output.
func (a *ansible) play(name, playbook string, args ...string) (map[string]recap, string, error) {
	a.t.Helper()
	pb := filepath.Join(a.dir, name+".yml")
	if err := os.WriteFile(pb, []byte(playbook), 0o644); err != nil {
		a.t.Fatal(err)
	}
	vars, _ := json.Marshal(a.vars)
	varsFile := filepath.Join(a.dir, "vars.json")
	if err := os.WriteFile(varsFile, vars, 0o644); err != nil {
		a.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(a.t.Context(), playbookTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ansible-playbook", append([]string{"-i", "localhost,", "-e", "@" + varsFile, pb}, args...)...)
	cmd.Dir = a.dir
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = a.environ()
	out, err := cmd.CombinedOutput()
	counts := map[string]recap{}
	for _, m := range recapLine.FindAllStringSubmatch(string(out), -1) {
		n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
		counts[m[1]] = recap{ok: n(2), changed: n(3), unreachable: n(4), failed: n(5)}
	}
	return counts, string(out), err
}

// environ keeps Ansible's files in the test's dir and finds the collection there.
func (a *ansible) environ() []string {
	return append(os.Environ(),
		"ANSIBLE_COLLECTIONS_PATH="+a.dir,
		"ANSIBLE_HOME="+filepath.Join(a.dir, "home"),
		"ANSIBLE_LOCAL_TEMP="+filepath.Join(a.dir, "tmp"),
		"ANSIBLE_NOCOLOR=1",
		"ANSIBLE_RETRY_FILES_ENABLED=0",
		"ANSIBLE_LOCALHOST_WARNING=0",
		"ANSIBLE_PYTHON_INTERPRETER=/usr/bin/python3",
	)
}

// inventory runs ansible-inventory --list on the vmfork inventory plugin.
func (a *ansible) inventory() map[string]json.RawMessage {
	a.t.Helper()
	src := filepath.Join(a.dir, "machines.vmfork.yml")
	conf := "plugin: vmfork.vmfork.vmfork\nbinary: " + a.e.bin + "\nstate_dir: " + a.e.stateDir + "\nmem_dir: " + a.e.memDir + "\n"
	if err := os.WriteFile(src, []byte(conf), 0o644); err != nil {
		a.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(a.t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ansible-inventory", "-i", src, "--list")
	cmd.Env = a.environ()
	out, err := cmd.Output()
	var inv map[string]json.RawMessage
	if err != nil || json.Unmarshal(out, &inv) != nil {
		a.t.Fatalf("ansible-inventory: %v\n%s", err, out)
	}
	return inv
}

// site.yml: boot the parent, burst children with a hostname pattern through
// the role, then a second play in each child through the agent connection:
// raw (a shell only) and script (a file moved through the guest agent).
const sitePlaybook = `
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: vmfork.vmfork.burst
      vars:
        burst_parent: web
        burst_boot:
          kernel: "{{ kernel }}"
          initrd: "{{ initrd }}"
          disk: "{{ disk }}"
          memory: 256M
        burst_count: "{{ count | default(3) }}"
        burst_hostname: "node{n}"
        burst_binary: "{{ vmfork_bin }}"
        burst_state_dir: "{{ vmfork_state }}"
        burst_mem_dir: "{{ vmfork_mem }}"
        burst_timeout: 300

- hosts: burst
  gather_facts: false
  tasks:
    - name: The child's hostname, through the guest agent
      ansible.builtin.raw: hostname
      register: h
      changed_when: false
      when: not ansible_check_mode
    - name: A script copied in through the guest agent
      ansible.builtin.script: "{{ playbook_dir }}/hello.sh {{ inventory_hostname }}"
      register: s
      changed_when: false
      when: not ansible_check_mode
    - ansible.builtin.assert:
        that:
          - h.stdout | trim == vmfork_hostname
          - "'hello from ' ~ vmfork_hostname ~ ' as ' ~ inventory_hostname in s.stdout"
      when: not ansible_check_mode
`

const removePlaybook = `
- hosts: localhost
  connection: local
  gather_facts: false
  module_defaults:
    group/vmfork.vmfork.vmfork:
      binary: "{{ vmfork_bin }}"
      state_dir: "{{ vmfork_state }}"
      mem_dir: "{{ vmfork_mem }}"
  tasks:
    - vmfork.vmfork.vmfork_info:
      register: before
    - name: Children first, then the parent
      vmfork.vmfork.vmfork_machine:
        name: "{{ item }}"
        state: absent
      loop: "{{ (before.lineage.web.children | default([])) + ['web'] }}"
    - vmfork.vmfork.vmfork_info:
      register: after
    - ansible.builtin.assert:
        that:
          - after.machines == []
          - after.templates == []
`

// Wrong arguments fail with Ansible's messages or the CLI's one-line error
// and exit code; nothing boots.
const badPlaybook = `
- hosts: localhost
  connection: local
  gather_facts: false
  module_defaults:
    group/vmfork.vmfork.vmfork:
      binary: "{{ vmfork_bin }}"
      state_dir: "{{ vmfork_state }}"
      mem_dir: "{{ vmfork_mem }}"
  tasks:
    - vmfork.vmfork.vmfork_fork: {parent: nope, count: 1}
      register: unknown
      ignore_errors: true
    - vmfork.vmfork.vmfork_fork: {parent: web, count: 0}
      register: zero
      ignore_errors: true
    - vmfork.vmfork.vmfork_fork: {parent: web, count: 2, names: [a, b]}
      register: both
      ignore_errors: true
    - vmfork.vmfork.vmfork_fork: {parent: web, colour: red}
      register: unknown_option
      ignore_errors: true
    - vmfork.vmfork.vmfork_machine: {name: Bad_Name, kernel: /nonexistent}
      register: bad_boot
      ignore_errors: true
    - ansible.builtin.assert:
        that:
          - unknown.rc == 4
          - "unknown.msg == 'fork: machine \"nope\": not found'"
          - "zero.msg == 'count must be at least 1, got 0'"
          - "'mutually exclusive: names|count' in both.msg"
          - "'Unsupported parameters' in unknown_option.msg"
          - "bad_boot.rc == 2 and 'Bad_Name' in bad_boot.msg"
`

func TestAnsiblePlaybook(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	a := newAnsible(t, e)
	a.vars["kernel"], a.vars["initrd"], a.vars["disk"] = e.guest.Kernel, e.guest.Initrd, e.guest.Disk
	script := "#!/bin/sh\necho \"hello from $(hostname) as $1\"\n"
	if err := os.WriteFile(filepath.Join(a.dir, "hello.sh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	if rc, out, err := a.play("bad", badPlaybook); err != nil || rc["localhost"].failed != 0 {
		t.Fatalf("bad-arguments playbook: %v\n%s", err, out)
	}
	if ms := e.list(); len(ms) != 0 {
		t.Fatalf("bad arguments left machines: %+v", ms)
	}

	// Check mode on a fresh host: the boot is a dry run, the fork says it
	// waits for that parent; nothing is made.
	rc, out, err := a.play("site", sitePlaybook, "--check")
	if err != nil || rc["localhost"].failed != 0 || rc["localhost"].changed != 2 {
		t.Fatalf("check run on a fresh host: %v, recap %+v, want changed=2 (boot, fork) failed=0\n%s", err, rc["localhost"], out)
	}
	if ms := e.list(); len(ms) != 0 {
		t.Fatalf("check mode made machines: %+v", ms)
	}

	rc, out, err = a.play("site", sitePlaybook)
	if err != nil {
		t.Fatalf("first run: %v\n%s", err, out)
	}
	// The boot and the fork change; the children's play checks only.
	if got := rc["localhost"]; got.changed != 2 || got.failed != 0 {
		t.Errorf("first run: localhost %+v, want changed=2 (boot, fork) failed=0\n%s", got, out)
	}
	for _, c := range []string{"web-1", "web-2", "web-3"} {
		if got := rc[c]; got.ok == 0 || got.failed != 0 || got.unreachable != 0 {
			t.Errorf("first run: %s %+v, want its tasks ok\n%s", c, got, out)
		}
	}
	hosts := map[string]string{}
	for _, m := range e.list() {
		hosts[m.Name] = m.Parent
	}
	var ls []struct {
		Name     string `json:"name"`
		Hostname string `json:"hostname"`
	}
	e.jsonOK(&ls, "ls")
	names := map[string]string{}
	for _, m := range ls {
		names[m.Name] = m.Hostname
	}
	if len(names) != 4 || names["web-1"] != "node1" || names["web-2"] != "node2" || names["web-3"] != "node3" || hosts["web-1"] != "web" {
		t.Fatalf("machines after the burst: %v (parents %v), want web, and web-1..web-3 as node1..node3", names, hosts)
	}

	inv := a.inventory()
	var parent struct{ Hosts []string }
	var meta struct {
		HostVars map[string]struct {
			MAC        string `json:"vmfork_mac"`
			Hostname   string `json:"vmfork_hostname"`
			Connection string `json:"ansible_connection"`
		} `json:"hostvars"`
	}
	json.Unmarshal(inv["vmfork_parent_web"], &parent)
	json.Unmarshal(inv["_meta"], &meta)
	if strings.Join(parent.Hosts, ",") != "web-1,web-2,web-3" {
		t.Errorf("inventory group vmfork_parent_web: %v, want web-1,web-2,web-3", parent.Hosts)
	}
	if h := meta.HostVars["web-2"]; h.Hostname != "node2" || h.MAC == "" || h.Connection != "vmfork.vmfork.agent" {
		t.Errorf("inventory host vars of web-2: %+v, want hostname node2, a MAC and the agent connection", h)
	}

	rc, out, err = a.play("site", sitePlaybook)
	if err != nil {
		t.Fatalf("second run: %v\n%s", err, out)
	}
	for _, h := range []string{"localhost", "web-1", "web-2", "web-3"} {
		if got := rc[h]; got.changed != 0 || got.failed != 0 || got.ok == 0 {
			t.Errorf("second run: %s %+v, want changed=0 failed=0\n%s", h, got, out)
		}
	}

	// Check mode with one more child wanted: the fork reports the change
	// (vmfork fork --dry-run) and nothing is made.
	rc, out, err = a.play("site", sitePlaybook, "--check", "--diff", "-e", "count=4")
	if err != nil {
		t.Fatalf("check run: %v\n%s", err, out)
	}
	if got := rc["localhost"]; got.changed != 1 || got.failed != 0 {
		t.Errorf("check run: localhost %+v, want changed=1 (the fork of web-4)\n%s", got, out)
	}
	if !regexp.MustCompile(`(?m)^\+.*"web-4"`).MatchString(out) {
		t.Errorf("check run's diff does not name web-4:\n%s", out)
	}
	if ms := e.list(); len(ms) != 4 {
		t.Errorf("check mode changed the machines: %+v", ms)
	}
	var tpls []json.RawMessage
	e.jsonOK(&tpls, "template", "ls")
	if len(tpls) != 1 {
		t.Errorf("check mode changed the templates: %d, want the burst's one", len(tpls))
	}

	rc, out, err = a.play("remove", removePlaybook)
	// One looped task: the recap counts it once; each item says changed.
	if n := strings.Count(out, "changed: [localhost] => (item="); err != nil || rc["localhost"].failed != 0 || n != 4 {
		t.Fatalf("remove run: %v, recap %+v, %d items changed, want 4 machines removed\n%s", err, rc["localhost"], n, out)
	}
	if ms := e.list(); len(ms) != 0 {
		t.Errorf("machines left: %+v", ms)
	}
	if pids := e.qemuProcesses(); len(pids) != 0 {
		t.Errorf("QEMU processes left: %v", pids)
	}
	if left, _ := os.ReadDir(e.memDir); len(left) != 0 {
		t.Errorf("RAM files left in %s: %d", e.memDir, len(left))
	}
}

// The agent connection runs real Python modules (setup, copy, command) in a
// fork child of the Debian guest, which has python3 and no SSH key for us.
const debianPlaybook = `
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - vmfork.vmfork.vmfork_fork:
        parent: deb
        names: [deb-1]
        hostname: "box-{n}"
        binary: "{{ vmfork_bin }}"
        state_dir: "{{ vmfork_state }}"
        mem_dir: "{{ vmfork_mem }}"
        timeout: 300
      register: forked
    - ansible.builtin.add_host:
        name: "{{ item.name }}"
        groups: children
        ansible_connection: vmfork.vmfork.agent
        vmfork_binary: "{{ vmfork_bin }}"
        vmfork_state_dir: "{{ vmfork_state }}"
        vmfork_mem_dir: "{{ vmfork_mem }}"
        vmfork_hostname: "{{ item.hostname }}"
      loop: "{{ forked.children }}"

- hosts: children
  gather_facts: true
  tasks:
    - ansible.builtin.copy:
        content: "configured by ansible in {{ inventory_hostname }}\n"
        dest: /etc/motd
        mode: "0644"
    - ansible.builtin.command: cat /etc/motd
      register: motd
      changed_when: false
    - ansible.builtin.fetch:
        src: /etc/machine-id
        dest: "{{ playbook_dir }}/fetched/"
    - ansible.builtin.assert:
        that:
          - ansible_facts.hostname == vmfork_hostname
          - motd.stdout == 'configured by ansible in ' ~ inventory_hostname
`

func TestAnsibleDebianModules(t *testing.T) {
	parallel(t) // heavy and self-contained (tests/doc.go, "Parallel")
	e := newDebianEnv(t)
	a := newAnsible(t, e.env)
	// A child of the shared template (tests/doc.go): ifupdown without dbus,
	// which the modules and the agent connection do not use.
	e.forkDebian("deb")
	e.settle("deb")
	rc, out, err := a.play("debian", debianPlaybook)
	if err != nil {
		t.Fatalf("playbook: %v\n%s", err, out)
	}
	// The fork and the copy change; setup, command and assert check.
	if got := rc["deb-1"]; got.failed != 0 || got.unreachable != 0 || got.changed != 2 {
		t.Errorf("deb-1: %+v, want changed=2 (copy, fetch) failed=0\n%s", got, out)
	}
	if got := strings.TrimSpace(e.exec("deb-1", "hostname")); got != "box-1" {
		t.Errorf("deb-1 hostname %q, want box-1", got)
	}
	fetched, err := os.ReadFile(filepath.Join(a.dir, "fetched", "deb-1", "etc", "machine-id"))
	if want := strings.TrimSpace(e.exec("deb-1", "cat", "/etc/machine-id")); err != nil || strings.TrimSpace(string(fetched)) != want {
		t.Errorf("fetched machine-id %q (%v), want the child's %q", fetched, err, want)
	}
}
