package customize

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

func testChild(index int) Child {
	return Child{
		Name: "web-" + string(rune('0'+index)), Parent: "web", Template: "web.1", Index: index, Mode: ModeFresh,
		MAC: "52:54:00:aa:bb:0" + string(rune('0'+index)), OldMACs: []string{"52:54:00:00:00:01"},
		VMGenID: "11111111-2222-4333-8444-555555555555", TemplateVMGenID: "99999999-2222-4333-8444-555555555555",
	}
}

func runSpec(t *testing.T, s Spec, a *fakeAgent, c Child, link Link) (*Result, error) {
	t.Helper()
	chain, err := s.Chain()
	if err != nil {
		t.Fatal(err)
	}
	return Run(t.Context(), chain, &Env{Agent: a, Child: c, Link: link})
}

func statuses(res *Result) string {
	var b []string
	for _, s := range res.Steps {
		b = append(b, s.Name+"="+string(s.Status))
	}
	return strings.Join(b, " ")
}

func TestDefaultChainOnAFakeGuest(t *testing.T) {
	a := newFakeAgent().guest()
	link := &fakeLink{}
	res, err := runSpec(t, Spec{Hostname: "web-{n}"}, a, testChild(2), link)
	if err != nil {
		t.Fatalf("Run = %v\ncalls:\n%s", err, a.callLog())
	}
	want := "vmfork.agent=ok vmfork.clock=ok vmfork.rng=ok vmfork.hostname=ok vmfork.machine-id=ok " +
		"vmfork.ssh-host-keys=skipped vmfork.network=ok vmfork.hooks=ok"
	if got := statuses(res); got != want {
		t.Errorf("steps:\n got %s\nwant %s", got, want)
	}
	if res.Hostname != "web-2" || res.MAC != "52:54:00:aa:bb:02" || len(res.MachineID) != 32 {
		t.Errorf("result = %+v", res)
	}
	if got := strings.Join(res.Addresses, " "); got != "10.0.2.16/24" {
		t.Errorf("addresses = %s, want the DHCP lease without link-local ones", got)
	}
	// DHCP needs the link, and it comes up only after the MAC changed.
	log := a.callLog()
	if i, j := strings.Index(log, "run sh:mac"), strings.Index(log, "run sh:dhcp"); i < 0 || j < i {
		t.Errorf("MAC change and DHCP out of order:\n%s", log)
	}
	// The clock needs no ping of its own: its first read measures the
	// round trip.
	if n := strings.Count(log, "ping"); n != 1 {
		t.Errorf("%d pings, want the agent step's only:\n%s", n, log)
	}
	if !slices.Equal(link.ups, []bool{true}) {
		t.Errorf("link changes = %v, want one up for DHCP", link.ups)
	}
	if d := a.clock.Sub(time.Now()).Abs(); d > time.Second {
		t.Errorf("guest clock %v off host time after the clock step", d)
	}
	for _, r := range a.runs {
		if r.Path == PostForkDir+"/10-example" {
			for _, kv := range []string{"VMFORK_NAME=web-2", "VMFORK_PARENT=web", "VMFORK_INDEX=2", "VMFORK_HOSTNAME=web-2", "VMFORK_MAC=52:54:00:aa:bb:02"} {
				if !slices.Contains(r.Env, kv) {
					t.Errorf("hook env %v lacks %s", r.Env, kv)
				}
			}
		}
	}
}

func TestStaticNetworkKeepsTheLinkDown(t *testing.T) {
	a := newFakeAgent().guest()
	link := &fakeLink{}
	s := Spec{Network: NetworkSpec{Addresses: []string{"10.0.2.21/24", "10.0.2.22/24"}, Gateway: "10.0.2.2"}}
	res, err := runSpec(t, s, a, testChild(2), link)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(res.Addresses, " "); got != "10.0.2.22/24" {
		t.Errorf("addresses = %s, want the second static address", got)
	}
	if len(link.ups) != 0 {
		t.Errorf("link changed %v; static addresses need no link", link.ups)
	}
	if strings.Contains(a.callLog(), "sh:dhcp") {
		t.Errorf("DHCP ran with static addresses")
	}
	// A child beyond the list fails, and says why.
	_, err = runSpec(t, s, newFakeAgent().guest(), testChild(3), link)
	if err == nil || !strings.Contains(err.Error(), "no static address for child 3: the spec lists 2") {
		t.Errorf("third child = %v", err)
	}
}

func TestNetworkFindsTheNIC(t *testing.T) {
	step := NetworkStep(NetworkSpec{Mode: NetworkNone})
	a := newFakeAgent().guest()
	a.ifaces = append(a.ifaces, qmp.NetworkInterface{Name: "eth1", HardwareAddress: "52:54:00:00:00:07"})
	c := testChild(1)
	c.OldMACs = []string{"52:54:00:00:00:07"}
	res, err := Run(t.Context(), NewChain(step), &Env{Agent: a, Child: c})
	if err != nil || a.ifaces[2].HardwareAddress != c.MAC || !strings.HasPrefix(res.Steps[0].Detail, "eth1 ") {
		t.Errorf("NIC with the old MAC: %v, %+v, interfaces %+v", err, res.Steps, a.ifaces)
	}
	// Without the old MAC there is no telling.
	a = newFakeAgent().guest()
	a.ifaces = append(a.ifaces, qmp.NetworkInterface{Name: "eth1", HardwareAddress: "52:54:00:00:00:07"})
	c.OldMACs = nil
	_, err = Run(t.Context(), NewChain(step), &Env{Agent: a, Child: c})
	if err == nil || err.Error() != `step "vmfork.network": the guest has several network interfaces (eth0, eth1); set network.interface` {
		t.Errorf("two NICs and no old MAC: %v", err)
	}
}

func TestReproducibleKeepsClockAndVMGenID(t *testing.T) {
	a := newFakeAgent().guest()
	c := testChild(1)
	c.Mode, c.VMGenID = ModeReproducible, c.TemplateVMGenID
	res, err := runSpec(t, Spec{Identity: ModeReproducible}, a, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(statuses(res), "vmfork.clock=skipped vmfork.rng=skipped") || res.Mode != ModeReproducible {
		t.Errorf("steps = %s, mode %s", statuses(res), res.Mode)
	}
	log := a.callLog()
	if strings.Contains(log, "set-time") || strings.Contains(log, "sh:rng") {
		t.Errorf("a reproducible child's clock or RNG was touched:\n%s", log)
	}
	// With a GUID of its own the child would not be reproducible.
	c.VMGenID = "other"
	if _, err := runSpec(t, Spec{Identity: ModeReproducible}, newFakeAgent().guest(), c, nil); err == nil ||
		!strings.Contains(err.Error(), `step "vmfork.rng": a reproducible identity needs the template's vmgenid`) {
		t.Errorf("reproducible child with a new GUID: %v", err)
	}
}

func TestRNGStep(t *testing.T) {
	c := testChild(1)
	c.VMGenID = c.TemplateVMGenID
	_, err := Run(t.Context(), NewChain(RNGStep()), &Env{Agent: newFakeAgent().guest(), Child: c})
	if err == nil || !strings.Contains(err.Error(), "has its template's vmgenid") {
		t.Errorf("fresh child with its template's GUID: %v", err)
	}
	a := newFakeAgent().guest()
	a.scripts[rngScript] = func([]string) qmp.ExecStatus {
		return qmp.ExecStatus{Exited: true, ExitCode: 1, Stderr: []byte("the guest kernel has no vmgenid driver (CONFIG_VMGENID)\n")}
	}
	_, err = Run(t.Context(), NewChain(RNGStep()), &Env{Agent: a, Child: testChild(1)})
	if err == nil || !strings.Contains(err.Error(), "no vmgenid driver") {
		t.Errorf("kernel without vmgenid: %v", err)
	}
	a.scripts[rngScript] = func([]string) qmp.ExecStatus { return ok("uninitialized\n") }
	res, err := Run(t.Context(), NewChain(RNGStep()), &Env{Agent: a, Child: testChild(1)})
	if err != nil || !strings.Contains(res.Steps[0].Detail, "not seeded yet") {
		t.Errorf("CRNG not yet seeded: %v %+v", err, res.Steps)
	}
}

func TestBootedChildSkipsRNG(t *testing.T) {
	c, _ := Spec{}.Chain()
	res, err := Run(t.Context(), Booted(c), &Env{Agent: newFakeAgent().guest(), Child: Child{Name: "b", Index: 1, MAC: "52:54:00:00:00:09"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(statuses(res), "vmfork.rng=skipped") {
		t.Errorf("steps = %s", statuses(res))
	}
}

func TestScriptStep(t *testing.T) {
	a := newFakeAgent()
	var got []string
	a.scripts[runScript] = func(args []string) qmp.ExecStatus {
		got = args
		return ok("")
	}
	_, err := Run(t.Context(), NewChain(ScriptStep("acme.setup", []byte("#!/bin/sh\necho hi\n"), []string{"--fast"})), &Env{Agent: a, Child: testChild(1)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1] != "--fast" || string(a.files[got[0]]) != "#!/bin/sh\necho hi\n" {
		t.Errorf("script run as %v with files %v", got, a.files)
	}
	if !strings.HasPrefix(got[0], "/tmp/.vmfork-acme.setup-") {
		t.Errorf("script copied to %s", got[0])
	}
}

func TestClockStepChecksTheResult(t *testing.T) {
	a := newFakeAgent()
	// A guest whose clock does not move when set.
	stuck := &stuckClock{a}
	_, err := Run(t.Context(), NewChain(ClockStep()), &Env{Agent: stuck})
	if err == nil || !strings.Contains(err.Error(), "off host time after setting it") {
		t.Errorf("stuck clock: %v", err)
	}
}

type stuckClock struct{ *fakeAgent }

func (s *stuckClock) SetTime(context.Context, *time.Time) error { return nil }

func TestExpandHostname(t *testing.T) {
	c := Child{Name: "web-3", Parent: "web", Index: 3}
	for pattern, want := range map[string]string{
		"web-{n}":         "web-3",
		"{name}":          "web-3",
		"{parent}-c{n}":   "web-c3",
		"{name}.lab.test": "web-3.lab.test",
	} {
		if got, err := ExpandHostname(pattern, c); err != nil || got != want {
			t.Errorf("ExpandHostname(%q) = %q, %v; want %q", pattern, got, err, want)
		}
	}
	for pattern, says := range map[string]string{
		"web-{x}":               "unknown placeholder {x}",
		"web-{n":                "unclosed {",
		"web_{n}":               "'_' is not allowed",
		"-{n}":                  "not start or end with '-'",
		"":                      "1 to 253 characters",
		strings.Repeat("a", 64): "1 to 63 characters",
	} {
		if _, err := ExpandHostname(pattern, c); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("ExpandHostname(%q) = %v, want an error saying %q", pattern, err, says)
		}
	}
}

func TestChildMAC(t *testing.T) {
	seen := map[string]bool{}
	for i := 1; i <= 1000; i++ {
		m := ChildMAC([]byte("web.1"), i)
		if seen[m] || !strings.HasPrefix(m, "52:54:00:") || len(m) != 17 {
			t.Fatalf("child %d: MAC %s repeated or malformed", i, m)
		}
		seen[m] = true
	}
	m := ChildMAC([]byte("web.1"), 1)
	if got := ChildMAC([]byte("web.1"), 1, m); got == m {
		t.Errorf("ChildMAC did not avoid %s", m)
	}
	if ChildMAC([]byte("web.2"), 1) == m {
		t.Errorf("two templates gave their first children the same MAC")
	}
}
