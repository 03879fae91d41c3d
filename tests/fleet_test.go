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
