//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fleetPlaybook runs the fleet role on both rig hosts, over SSH from host
// A's namespace (the only place both are reachable), and writes what the
// role returned (every host's placement and push, and the one list of
// children) to out.json on the controller.
const fleetPlaybook = `
- hosts: fleet
  gather_facts: false
  roles:
    - role: vmfork.vmfork.fleet
      vars:
        fleet_template: golden
        fleet_source: a
        fleet_count: 10
        fleet_prefix: c
        fleet_binary: "{{ vmfork_bin }}"
        fleet_ssh: "ssh -F {{ ssh_config }}"
        fleet_timeout: 600
  post_tasks:
    - name: What the role returned, for the test
      ansible.builtin.copy:
        dest: "{{ playbook_dir }}/out.json"
        content: >-
          {{ {'children': fleet_children_all,
              'placement': fleet_placement,
              'pushed': {'b': hostvars['b'].fleet_pushed | default({})}} | to_json }}
      delegate_to: localhost
      run_once: true
      changed_when: false
`

type fleetOut struct {
	Children []struct {
		Name string `json:"name"`
		Host string `json:"vmfork_host"`
	} `json:"children"`
	Placement struct {
		ChildRAM int64 `json:"child_ram_bytes"`
		Hosts    map[string]struct {
			Room  int64    `json:"room_bytes"`
			Names []string `json:"names"`
			New   []string `json:"new"`
		} `json:"hosts"`
	} `json:"placement"`
	Pushed map[string]struct {
		Changed bool `json:"changed"`
		Skipped bool `json:"skipped"`
		Held    bool `json:"held"`
	} `json:"pushed"`
}

// TestAnsibleFleet (issue 24, item 3): ansible-playbook with the fleet role
// on two rig hosts (hosts_test.go) of unequal room: both see the same free
// RAM (one kernel), and their sshds give their sessions VMFORK_OVERCOMMIT 1
// and 4, so B's ram_for_new_bytes is 4 times A's. The role places 10
// children 2 : 8, pushes template golden from A to B once, forks on both
// in parallel and returns one list with each child's host; a second run
// pushes and forks nothing and reports changed=0.
func TestAnsibleFleet(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	r := newHostRig(t, "VMFORK_OVERCOMMIT=1", "VMFORK_OVERCOMMIT=4")
	a, b := r.hosts[0], r.hosts[1]
	a.boot("src", "--memory", "128M")
	a.ok("template", "save", "src", "golden")
	an := newAnsible(t, a.env)
	inv := filepath.Join(an.dir, "hosts.ini")
	invText := "[fleet]\na ansible_host=" + a.addr + "\nb ansible_host=" + b.addr + "\n\n[fleet:vars]\n" +
		"ansible_user=root\nansible_python_interpreter=/usr/bin/python3\nansible_ssh_common_args=-F " + r.sshCF + "\n"
	if err := os.WriteFile(inv, []byte(invText), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(an.dir, "fleet.yml"), []byte(fleetPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}
	play := func(what string) (map[string]recap, fleetOut) {
		t.Helper()
		os.Remove(filepath.Join(an.dir, "out.json"))
		ctx, cancel := context.WithTimeout(t.Context(), playbookTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", a.ns, "ansible-playbook", "-i", inv,
			"-e", "vmfork_bin="+a.bin, "-e", "ssh_config="+r.sshCF, filepath.Join(an.dir, "fleet.yml"))
		cmd.Dir = an.dir
		cmd.WaitDelay = 10 * time.Second
		// No ssh master left behind in the namespace (ControlPersist would
		// outlive the playbook); Ansible's remote temp files in the test's dir.
		cmd.Env = append(an.environ(), "ANSIBLE_SSH_ARGS=-o ControlMaster=no", "ANSIBLE_PIPELINING=1",
			"ANSIBLE_REMOTE_TMP="+filepath.Join(an.dir, "rtmp"))
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("%s run: %.1f s", what, time.Since(start).Seconds())
		counts := map[string]recap{}
		for _, m := range recapLine.FindAllStringSubmatch(string(out), -1) {
			n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
			counts[m[1]] = recap{ok: n(2), changed: n(3), unreachable: n(4), failed: n(5)}
		}
		var res fleetOut
		data, rerr := os.ReadFile(filepath.Join(an.dir, "out.json"))
		if err != nil || rerr != nil || json.Unmarshal(data, &res) != nil {
			t.Fatalf("%s run: %v (out.json: %v)\n%s", what, err, rerr, tail(string(out), 80))
		}
		return counts, res
	}

	rc, res := play("first")
	pa, pb := res.Placement.Hosts["a"], res.Placement.Hosts["b"]
	// The room the role read: B's is 4 times A's (the same free RAM read a
	// moment apart, another test's load moving it a little).
	if ratio := float64(pb.Room) / float64(pa.Room); ratio < 3.6 || ratio > 4.4 {
		t.Errorf("room read: a %d, b %d bytes (ratio %.2f), want about 1 : 4 (VMFORK_OVERCOMMIT 1 and 4)", pa.Room, pb.Room, ratio)
	}
	if len(pa.New) != 2 || len(pb.New) != 8 {
		t.Errorf("placement: a %v, b %v, want 2 and 8 children (in proportion to room 1 : 4)", pa.New, pb.New)
	}
	if got := rc["a"]; got.failed != 0 || got.changed != 1 {
		t.Errorf("first run: a %+v, want changed=1 (its fork)", got)
	}
	if got := rc["b"]; got.failed != 0 || got.changed != 2 {
		t.Errorf("first run: b %+v, want changed=2 (the push to it, its fork)", got)
	}
	if p := res.Pushed["b"]; !p.Changed || p.Held {
		t.Errorf("first run: push to b %+v, want a push (b did not hold golden)", p)
	}
	chunks := len(b.chunkFiles())
	if chunks == 0 {
		t.Errorf("b's chunk store is empty after the push")
	}
	// One list, each child with its host, as each host lists its machines.
	listed := map[string]string{}
	for _, c := range res.Children {
		listed[c.Name] = c.Host
	}
	on := func(h *rigHost) []string {
		var names []string
		for _, m := range h.list() {
			if strings.HasPrefix(m.Name, "c-") && m.State == "running" {
				names = append(names, m.Name)
			}
		}
		sort.Strings(names)
		return names
	}
	onA, onB := on(a), on(b)
	if len(listed) != 10 || len(onA)+len(onB) != 10 || len(onA) != len(pa.New) {
		t.Errorf("children: returned %v, running on a %v, on b %v, want 10 in all as placed", listed, onA, onB)
	}
	for h, names := range map[string][]string{"a": onA, "b": onB} {
		for _, n := range names {
			if listed[n] != h {
				t.Errorf("child %s runs on %s, returned as on %q", n, h, listed[n])
			}
		}
	}

	// The second run: every child exists, b holds golden: nothing changes.
	rc, res = play("second")
	for _, h := range []string{"a", "b"} {
		if got := rc[h]; got.failed != 0 || got.changed != 0 || got.ok == 0 {
			t.Errorf("second run: %s %+v, want changed=0 failed=0", h, got)
		}
		if p := res.Placement.Hosts[h]; len(p.New) != 0 {
			t.Errorf("second run placed %v on %s, want none", p.New, h)
		}
	}
	if p := res.Pushed["b"]; !p.Skipped {
		t.Errorf("second run: push to b %+v, want none (b holds golden)", p)
	}
	if got := len(b.chunkFiles()); got != chunks {
		t.Errorf("b's chunk store: %d chunks after the second run, %d after the first", got, chunks)
	}
	if len(res.Children) != 10 || len(on(a))+len(on(b)) != 10 {
		t.Errorf("second run: %d children returned, %d running, want 10", len(res.Children), len(on(a))+len(on(b)))
	}
}

// forkToPlaybook pushes golden to host B, forks src's instant onto B and
// pulls golden back from B under another name, with the modules' --to and
// push/pull modes, from host A's namespace; it writes what each returned.
const forkToPlaybook = `
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    here: &here
      binary: "{{ vmfork_bin }}"
      state_dir: "{{ vmfork_state }}"
      mem_dir: "{{ vmfork_mem }}"
      ssh: "ssh -F {{ ssh_config }}"
      remote_binary: "{{ vmfork_bin }}"
      timeout: 600
  tasks:
    - name: Give B golden
      vmfork.vmfork.vmfork_push:
        <<: *here
        name: golden
        to: "{{ host_b }}"
      register: pushed
    - name: Fork src onto B
      vmfork.vmfork.vmfork_fork:
        <<: *here
        parent: src
        names: [far-1]
        hostname: "far{n}"
        to: "{{ host_b }}"
      register: far
    - name: Fetch golden back from B as golden-back
      vmfork.vmfork.vmfork_push:
        <<: *here
        name: golden-back
        from: "{{ host_b }}:golden"
      register: pulled
    - name: What the modules returned, for the test
      ansible.builtin.copy:
        dest: "{{ playbook_dir }}/out.json"
        content: "{{ {'pushed': pushed, 'far': far, 'pulled': pulled} | to_json }}"
      changed_when: false
`

type moduleOut struct {
	Changed  bool `json:"changed"`
	Held     bool `json:"held"`
	Transfer *struct {
		Op       string `json:"op"`
		Received struct {
			ChunksSent int `json:"chunks_sent"`
			Chunks     int `json:"chunks"`
		} `json:"received"`
	} `json:"transfer"`
	Children []struct {
		Name     string `json:"name"`
		Host     string `json:"host"`
		Created  bool   `json:"created"`
		Hostname string `json:"hostname"`
		PID      int    `json:"pid"`
	} `json:"children"`
}

// TestAnsibleForkToAndPull (issue 24, item 3: the modules learn --to and
// push/pull): on the two rig hosts, a playbook on host A pushes golden to B
// (vmfork_push to:), forks src onto B (vmfork_fork to:, vmfork fork --to)
// and pulls golden back as golden-back (vmfork_push from:, which sends no
// chunk: A has them all). A second run changes nothing: B holds golden, the
// child exists there (same QEMU), A holds golden-back.
func TestAnsibleForkToAndPull(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	r := newHostRig(t)
	a, b := r.hosts[0], r.hosts[1]
	a.boot("src", "--memory", "128M")
	a.ok("template", "save", "src", "golden")
	an := newAnsible(t, a.env)
	an.vars["ssh_config"], an.vars["host_b"] = r.sshCF, b.addr
	vars, _ := json.Marshal(an.vars)
	if err := os.WriteFile(filepath.Join(an.dir, "vars.json"), vars, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(an.dir, "forkto.yml"), []byte(forkToPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}
	play := func(what string) (recap, map[string]moduleOut) {
		t.Helper()
		os.Remove(filepath.Join(an.dir, "out.json"))
		ctx, cancel := context.WithTimeout(t.Context(), playbookTimeout)
		defer cancel()
		// In A's namespace: the only place B is reached from.
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", a.ns, "ansible-playbook", "-i", "localhost,",
			"-e", "@"+filepath.Join(an.dir, "vars.json"), filepath.Join(an.dir, "forkto.yml"))
		cmd.Dir = an.dir
		cmd.WaitDelay = 10 * time.Second
		cmd.Env = an.environ()
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("%s run: %.1f s", what, time.Since(start).Seconds())
		var rc recap
		if m := recapLine.FindStringSubmatch(string(out)); m != nil {
			n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
			rc = recap{ok: n(2), changed: n(3), unreachable: n(4), failed: n(5)}
		}
		res := map[string]moduleOut{}
		data, rerr := os.ReadFile(filepath.Join(an.dir, "out.json"))
		if err != nil || rerr != nil || json.Unmarshal(data, &res) != nil {
			t.Fatalf("%s run: %v (out.json: %v)\n%s", what, err, rerr, tail(string(out), 80))
		}
		return rc, res
	}

	rc, res := play("first")
	if rc.failed != 0 || rc.changed != 3 {
		t.Errorf("first run: %+v, want changed=3 (push, fork --to, pull)", rc)
	}
	if p := res["pushed"]; !p.Changed || p.Held || p.Transfer == nil || p.Transfer.Op != "push" {
		t.Errorf("first run: push %+v, want a push (B did not hold golden)", p)
	}
	far := res["far"].Children
	if len(far) != 1 || far[0].Name != "far-1" || far[0].Host != b.addr || !far[0].Created || far[0].Hostname != "far1" {
		t.Fatalf("first run: fork --to returned %+v, want far-1 made on %s as far1", far, b.addr)
	}
	var kid machineJSON
	for _, m := range b.list() {
		if m.Name == "far-1" {
			kid = m
		}
	}
	if kid.State != "running" || kid.Parent != "src" || kid.PID != far[0].PID {
		t.Errorf("far-1 on B: %+v, want running, a child of src, pid %d", kid, far[0].PID)
	}
	for _, m := range a.list() {
		if m.Name == "far-1" {
			t.Errorf("far-1 is a machine of A too")
		}
	}
	if p := res["pulled"]; !p.Changed || p.Transfer == nil || p.Transfer.Op != "pull" || p.Transfer.Received.ChunksSent != 0 {
		t.Errorf("first run: pull %+v, want a pull that sends no chunk (A has golden's)", p)
	}
	templateID(t, a.env, "golden-back")

	rc, res = play("second")
	if rc.failed != 0 || rc.changed != 0 || rc.ok == 0 {
		t.Errorf("second run: %+v, want changed=0 failed=0", rc)
	}
	if p := res["pushed"]; p.Changed || !p.Held {
		t.Errorf("second run: push %+v, want none (B holds golden)", p)
	}
	if c := res["far"].Children; len(c) != 1 || c[0].Created {
		t.Errorf("second run: fork --to returned %+v, want far-1 as it was", c)
	}
	for _, m := range b.list() {
		if m.Name == "far-1" && (m.PID != kid.PID || m.State != "running") {
			t.Errorf("second run: far-1 on B is %+v, want the same QEMU (pid %d) running", m, kid.PID)
		}
	}
	if p := res["pulled"]; p.Changed || !p.Held {
		t.Errorf("second run: pull %+v, want none (A holds golden-back)", p)
	}
}
