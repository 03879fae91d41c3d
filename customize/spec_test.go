package customize

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeSpec(t *testing.T, name, content string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "setup.sh"), []byte("#!/bin/sh\ntrue\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const fullYAML = `identity: reproducible
hostname: web-{n}
network:
  mode: static
  addresses: [10.0.2.21/24, 10.0.2.22/24]
  gateway: 10.0.2.2
  dns: [10.0.2.3]
skip: [vmfork.ssh-host-keys, vmfork.pre-fork-hooks]
timeouts:
  vmfork.agent: 5s
  vmfork.pre-fork-hooks: 2s
steps:
  - name: acme.setup
    script: setup.sh
    args: [--fast]
    after: vmfork.network
    timeout: 20s
on_failure: keep
`

const fullJSON = `{"identity": "reproducible", "hostname": "web-{n}",
 "network": {"mode": "static", "addresses": ["10.0.2.21/24", "10.0.2.22/24"], "gateway": "10.0.2.2", "dns": ["10.0.2.3"]},
 "skip": ["vmfork.ssh-host-keys", "vmfork.pre-fork-hooks"],
 "timeouts": {"vmfork.agent": "5s", "vmfork.pre-fork-hooks": "2s"},
 "steps": [{"name": "acme.setup", "script": "setup.sh", "args": ["--fast"], "after": "vmfork.network", "timeout": "20s"}],
 "on_failure": "keep"}`

func TestLoadSpecYAMLAndJSON(t *testing.T) {
	for name, content := range map[string]string{"spec.yaml": fullYAML, "spec.json": fullJSON} {
		s, err := LoadSpec(writeSpec(t, name, content))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Mode() != ModeReproducible || !s.KeepOnFailure() || s.Network.Gateway != "10.0.2.2" {
			t.Errorf("%s: spec = %+v", name, s)
		}
		c, err := s.Chain()
		if err != nil {
			t.Fatal(err)
		}
		want := "vmfork.agent vmfork.clock vmfork.rng vmfork.hostname vmfork.machine-id vmfork.ssh-host-keys vmfork.network acme.setup vmfork.hooks"
		if got := strings.Join(c.Names(), " "); got != want {
			t.Errorf("%s: chain %s", name, got)
		}
		if st, _ := c.Step(StepAgent); st.Timeout != 5*time.Second {
			t.Errorf("%s: agent timeout %v", name, st.Timeout)
		}
		if st, _ := c.Step("acme.setup"); st.Timeout != 20*time.Second {
			t.Errorf("%s: script timeout %v", name, st.Timeout)
		}
		pre := s.PreForkChain()
		res, err := Run(t.Context(), pre, &Env{Agent: newFakeAgent()})
		if err != nil || res.Steps[0].Status != StatusSkipped {
			t.Errorf("%s: pre-fork chain with the hooks skipped: %v %+v", name, err, res.Steps)
		}
		if err := s.ValidateFor(2); err != nil {
			t.Errorf("%s: ValidateFor(2) = %v", name, err)
		}
		if err := s.ValidateFor(3); err == nil || !strings.Contains(err.Error(), "2 static addresses for 3 children") {
			t.Errorf("%s: ValidateFor(3) = %v", name, err)
		}
	}
}

func TestLoadSpecEmptyIsTheDefault(t *testing.T) {
	s, err := LoadSpec(writeSpec(t, "empty.yaml", "# nothing\n"))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := s.Chain()
	if s.Mode() != ModeFresh || c.Len() != 8 || s.Network.EffectiveMode() != NetworkDHCP {
		t.Errorf("empty spec = %+v, chain %v", s, c.Names())
	}
}

func TestLoadSpecRejectsBadInput(t *testing.T) {
	cases := []struct {
		name, file, content, says string
	}{
		{"unknown key", "s.yaml", "hostnam: x\n", "field hostnam not found"},
		{"unknown nested key", "s.yaml", "network:\n  adresses: [10.0.2.21/24]\n", "field adresses not found"},
		{"unknown key json", "s.json", `{"hostnam": "x"}`, `unknown field "hostnam"`},
		{"two documents", "s.yaml", "hostname: a\n---\nhostname: b\n", "more than one YAML document"},
		{"trailing json", "s.json", `{"hostname": "a"} {}`, "unexpected data"},
		{"bad mode", "s.yaml", "identity: fast\n", `identity "fast": want fresh or reproducible`},
		{"bad network mode", "s.yaml", "network: {mode: bridge}\n", `network mode "bridge"`},
		{"bad address", "s.yaml", "network: {addresses: [10.0.2.300/24]}\n", `network address "10.0.2.300/24"`},
		{"address without prefix", "s.yaml", "network: {addresses: [10.0.2.21]}\n", "with a prefix length"},
		{"address twice", "s.yaml", "network: {addresses: [10.0.2.21/24, 10.0.2.21/24]}\n", "given twice"},
		{"static without addresses", "s.yaml", "network: {mode: static}\n", "needs addresses"},
		{"addresses with dhcp", "s.yaml", "network: {mode: dhcp, addresses: [10.0.2.21/24]}\n", "need mode static"},
		{"bad gateway", "s.yaml", "network: {addresses: [10.0.2.21/24], gateway: router}\n", `gateway "router"`},
		{"bad duration", "s.yaml", "timeouts: {vmfork.agent: soon}\n", `duration "soon"`},
		{"negative duration", "s.json", `{"timeouts": {"vmfork.agent": "-1s"}}`, `duration "-1s"`},
		{"number duration", "s.json", `{"timeouts": {"vmfork.agent": 5}}`, "want a string"},
		{"unknown step timeout", "s.yaml", "timeouts: {vmfork.agnet: 5s}\n", `timeouts: no step "vmfork.agnet"`},
		{"unknown skip", "s.yaml", "skip: [vmfork.hostnam]\n", `skip: no step "vmfork.hostnam"`},
		{"bad placeholder", "s.yaml", "hostname: web-{i}\n", "unknown placeholder {i}"},
		{"bad on_failure", "s.yaml", "on_failure: ignore\n", `on_failure "ignore"`},
		{"reserved step name", "s.yaml", "steps: [{name: vmfork.mine, script: setup.sh}]\n", "vmfork. is reserved"},
		{"bare step name", "s.yaml", "steps: [{name: mine, script: setup.sh}]\n", "namespaced"},
		{"missing script", "s.yaml", "steps: [{name: acme.x, script: nope.sh}]\n", "nope.sh"},
		{"after unknown", "s.yaml", "steps: [{name: acme.x, script: setup.sh, after: vmfork.nope}]\n", `after "vmfork.nope": no such step`},
		{"step twice", "s.yaml", "steps: [{name: acme.x, script: setup.sh}, {name: acme.x, script: setup.sh}]\n", "defined twice"},
		{"wrong type", "s.yaml", "skip: vmfork.hooks\n", "cannot unmarshal"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadSpec(writeSpec(t, c.file, c.content))
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("LoadSpec = %v, want an error saying %q", err, c.says)
			}
			if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "customize.") {
				t.Errorf("error is not one plain line: %q", err)
			}
		})
	}
}
