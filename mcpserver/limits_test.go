package mcpserver

import (
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/contract"
)

func mustContract(t *testing.T, js string) *contract.Contract {
	t.Helper()
	if js == "" {
		return nil
	}
	c, err := contract.ParseJSON([]byte(js))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return c
}

func TestNarrows(t *testing.T) {
	allow := `{"network":{"egress":{"allow":["example.com:443","10.0.0.0/8:*"]},"dns":"none","connections":"reset"}}`
	for _, tc := range []struct {
		base, agent string
		widens      string // "" if it narrows
	}{
		{"", "", ""},
		{"", `{"network":{"egress":"none"}}`, ""},
		{allow, `{"network":{"egress":"none","dns":"none","connections":"reset"}}`, ""},
		{allow, `{"network":{"egress":{"allow":["example.com:443"]},"dns":"none","connections":"reset"}}`, ""},
		{allow, `{"network":{"egress":{"allow":["example.org:443"]},"dns":"none","connections":"reset"}}`, "network.egress.allow example.org:443"},
		{allow, `{"network":{"egress":"all","dns":"none","connections":"reset"}}`, `network.egress "all"`},
		{allow, `{"network":{"egress":"none","dns":"host","connections":"reset"}}`, "network.dns"},
		{allow, `{"network":{"egress":"none","dns":"none","connections":"keep"}}`, "network.connections"},
		{allow, `{}`, `network.egress "all"`},
		{`{"network":{"egress":"none"}}`, `{"network":{"egress":{"allow":["example.com:443"]}}}`, "network.egress"},
		{"", `{"secrets":{"T":{"hosts":["api.example.com"],"value_from":{"exec":"cat /etc/shadow"}}}}`, "secrets.T"},
		{`{"secret_files":{"wipe":["/etc/key"]}}`, `{"secret_files":{"wipe":["/etc/key","/etc/other"]}}`, ""},
		{`{"secret_files":{"wipe":["/etc/key"]}}`, `{"secret_files":{"wipe":["/etc/other"]}}`, "secret_files.wipe drops"},
		{"", `{"secret_files":{"rotate":{"/etc/k":{"exec":"id"}}}}`, "secret_files.rotate adds"},
	} {
		err := Narrows(mustContract(t, tc.base), mustContract(t, tc.agent))
		switch {
		case tc.widens == "" && err != nil:
			t.Errorf("base %s, agent %s: %v", tc.base, tc.agent, err)
		case tc.widens != "" && (err == nil || !strings.Contains(err.Error(), tc.widens) || !strings.HasPrefix(err.Error(), "limit contract: ")):
			t.Errorf("base %s, agent %s: want a limit contract error naming %q, got %v", tc.base, tc.agent, tc.widens, err)
		}
	}
}

func TestLimitsTTL(t *testing.T) {
	l := Limits{Sources: []string{"web"}, TTLDefault: time.Minute, TTLMax: time.Hour}.WithDefaults()
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	if d, err := l.ttl(0); err != nil || d != time.Minute {
		t.Errorf("ttl(0) = %v, %v; want the default", d, err)
	}
	if d, err := l.ttl(60 * 30); err != nil || d != 30*time.Minute {
		t.Errorf("ttl(1800) = %v, %v", d, err)
	}
	if _, err := l.ttl(7200); err == nil || !IsLimit(err) || !strings.Contains(err.Error(), "limit ttl-max:") {
		t.Errorf("ttl(7200): want limit ttl-max, got %v", err)
	}
	if _, err := l.ttl(-1); err == nil || IsLimit(err) {
		t.Errorf("ttl(-1): want bad input, got %v", err)
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, l := range []Limits{
		{},                         // no source
		{Sources: []string{"a b"}}, // bad name
		{Sources: []string{"web"}, MaxMachines: -1},
		{Sources: []string{"web"}, MaxChildren: 500},
		{Sources: []string{"web"}, TTLDefault: 3 * time.Hour, TTLMax: time.Hour},
	} {
		if err := l.WithDefaults().Validate(); err == nil {
			t.Errorf("%+v: want an error", l)
		}
	}
}

func TestCheckExec(t *testing.T) {
	l := Limits{ExecAllow: []string{"python3", "/bin/true"}}
	for argv0, ok := range map[string]bool{"python3": true, "/usr/bin/python3": true, "/bin/true": true, "sh": false, "rm": false} {
		err := l.checkExec([]string{argv0})
		if (err == nil) != ok {
			t.Errorf("exec %s: %v", argv0, err)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "limit exec-allow: ") {
			t.Errorf("exec %s: %v does not name the limit", argv0, err)
		}
	}
	if err := (Limits{}).checkExec([]string{"anything"}); err != nil {
		t.Errorf("no allow list: %v", err)
	}
}

func TestTail(t *testing.T) {
	if got := tail([]byte("hello"), 10); got != "hello" {
		t.Errorf("tail short: %q", got)
	}
	if got := tail([]byte("abcdef"), 3); got != "def" {
		t.Errorf("tail: %q", got)
	}
	// A cut inside a rune starts at the next whole one.
	if got := tail([]byte("aé"), 1); got != "" {
		t.Errorf("tail into a rune: %q", got)
	}
}
