package egress

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (rewrite with go test ./egress -update)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (rewrite with -update and review the diff):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

// netns makes a network namespace of the test's own with a bridge br0
// and a veth pair, vm0 (a port of br0, standing in for a tap) and vm0p,
// and removes it when the test ends.
func netns(t *testing.T) (name string, h Host) {
	t.Helper()
	needRoot(t)
	name = fmt.Sprintf("egress-unit-%d-%d", os.Getpid(), nsCount)
	nsCount++
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("remove namespace %s: %v: %s", name, err, out)
		}
	})
	run("ip", "-n", name, "link", "add", "br0", "type", "bridge")
	run("ip", "-n", name, "link", "add", "vm0", "type", "veth", "peer", "name", "vm0p")
	run("ip", "-n", name, "link", "set", "vm0", "master", "br0")
	return name, Host{NetNS: "/run/netns/" + name}
}

var nsCount int

// nft runs the nft CLI in namespace ns: it reads back what the library
// made, as an administrator would.
func nft(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

var allowSpec = `network:
  egress:
    allow:
      - 169.254.169.254:80
      - 10.1.0.0/16:443
      - api.test:8443
      - "[2001:db8::/32]:*"
  dns: host
`

func compileSpec(t *testing.T, spec string) Rules {
	t.Helper()
	r, err := Compile(t.Context(), network(t, spec), fakeResolver{"api.test": {"192.0.2.7", "2001:db8:1::7"}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// jsonRules is what `nft -j list table` says of each rule: its chain,
// comment and verdict, in order.
func jsonRules(t *testing.T, out string) []string {
	t.Helper()
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("nft -j: %v", err)
	}
	var lines []string
	for _, obj := range doc.Nftables {
		raw, ok := obj["rule"]
		if !ok {
			continue
		}
		var r struct {
			Chain   string           `json:"chain"`
			Comment string           `json:"comment"`
			Expr    []map[string]any `json:"expr"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		verdict := "?"
		for _, e := range r.Expr {
			for k, v := range e {
				switch k {
				case "accept", "drop":
					verdict = k
				case "jump":
					verdict = "jump " + v.(map[string]any)["target"].(string)
				case "set":
					verdict = "update set"
				}
			}
		}
		lines = append(lines, r.Chain+": "+verdict+": "+r.Comment)
	}
	return lines
}

func TestApplyBridge(t *testing.T) {
	ns, h := netns(t)
	r := compileSpec(t, allowSpec)
	br := Bridge{Tap: "vm0", DNS: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}
	if err := h.ApplyBridge("web-1", br, r); err != nil {
		t.Fatal(err)
	}
	golden(t, "bridge_allow.nft", nft(t, ns, "list", "table", "bridge", "vmfork-web-1"))
	got := jsonRules(t, nft(t, ns, "-j", "list", "table", "bridge", "vmfork-web-1"))
	// The order is the contract: always-allowed, replies, DNS, link-local
	// allows, the link-local drop, allows, the default drop.
	from := slices.DeleteFunc(slices.Clone(got), func(s string) bool { return !strings.HasPrefix(s, "from_child: ") })
	want := []string{
		"from_child: accept: accept ARP",
		"from_child: accept: accept DHCP client to server (udp 68 to 67)",
		"from_child: accept: accept DHCPv6 client to server (udp 546 to 547)",
		"from_child: accept: accept IPv6 neighbour discovery (ICMPv6 133, 135, 136, hop limit 255)",
		"from_child: accept: accept MLD (ICMPv6 130, 131, 132, 143, hop limit 1)",
		"from_child: accept: accept replies on recorded ipv4 tcp flows",
		"from_child: accept: accept replies on recorded ipv4 udp flows",
		"from_child: accept: accept replies on recorded ipv6 tcp flows",
		"from_child: accept: accept replies on recorded ipv6 udp flows",
		"from_child: accept: accept DNS to 10.0.0.1 (dns: host)",
		"from_child: accept: accept tcp+udp 169.254.169.254 port 80 (allow 169.254.169.254:80)",
		"from_child: drop: drop link-local 169.254.0.0/16",
		"from_child: drop: drop link-local fe80::/10",
		"from_child: accept: accept tcp+udp 10.1.0.0/16 port 443 (allow 10.1.0.0/16:443)",
		"from_child: accept: accept tcp+udp 192.0.2.7 port 8443 (allow api.test:8443)",
		"from_child: accept: accept tcp+udp 2001:db8:1::7 port 8443 (allow api.test:8443)",
		"from_child: accept: accept tcp+udp 2001:db8::/32 any port (allow 2001:db8::/32)",
		"from_child: drop: drop everything else (egress: allow)",
	}
	if !slices.Equal(from, want) {
		t.Errorf("from_child:\n%s\nwant:\n%s", strings.Join(from, "\n"), strings.Join(want, "\n"))
	}
	for _, w := range []string{
		"prerouting: jump from_child: frames from tap vm0: from_child",
		"postrouting: jump to_child: frames to tap vm0: to_child",
		"to_child: update set: record ipv4 tcp flows toward the machine (peer . peer port . machine port)",
	} {
		if !slices.Contains(got, w) {
			t.Errorf("no rule %q in:\n%s", w, strings.Join(got, "\n"))
		}
	}

	// Replaced in place: one table, the new rules.
	if err := h.ApplyBridge("web-1", br, compileSpec(t, "network: {egress: all, dns: none}")); err != nil {
		t.Fatal(err)
	}
	golden(t, "bridge_all.nft", nft(t, ns, "list", "table", "bridge", "vmfork-web-1"))
	lines, err := h.List("web-1")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "bridge_all.list", strings.Join(lines, "\n")+"\n")

	// A second machine on the same bridge has a table of its own.
	if err := h.ApplyBridge("web-2", Bridge{Tap: "vm0"}, compileSpec(t, "network: {egress: none}")); err != nil {
		t.Fatal(err)
	}
	if tables := nft(t, ns, "list", "tables"); strings.Count(tables, "vmfork-") != 2 {
		t.Errorf("tables:\n%s\nwant vmfork-web-1 and vmfork-web-2", tables)
	}
	for _, m := range []string{"web-1", "web-2", "web-2"} { // twice: idempotent
		if err := h.Remove(m); err != nil {
			t.Fatalf("Remove %s: %v", m, err)
		}
	}
	if rs := nft(t, ns, "list", "ruleset"); strings.TrimSpace(rs) != "" {
		t.Errorf("after Remove, the ruleset is:\n%s", rs)
	}
	if lines, err := h.List("web-1"); err != nil || len(lines) != 0 {
		t.Errorf("List after Remove: %q, %v, want nothing", lines, err)
	}
}

func TestApplyUser(t *testing.T) {
	ns, h := netns(t)
	m := testMachine(t)
	cg, err := CreateCgroup(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveCgroup(m) })
	u := User{Cgroup: cg, Resolvers: []netip.Addr{netip.MustParseAddr("127.0.0.53")}}
	if err := h.ApplyUser("web-1", u, compileSpec(t, allowSpec)); err != nil {
		t.Fatal(err)
	}
	out := nft(t, ns, "list", "table", "inet", "vmfork-web-1")
	// nft prints the cgroup by id here: it looks ids up under
	// /sys/fs/cgroup, which on a hybrid host is not the cgroup2 mount.
	id := regexp.MustCompile(`socket cgroupv2 level 2 (\S+)`).FindStringSubmatch(out)
	if id == nil || (id[1] != fmt.Sprint(cg.ID) && id[1] != `"`+cg.Rel+`"`) {
		t.Errorf("no socket cgroupv2 match of cgroup %s (id %d) in:\n%s", cg.Rel, cg.ID, out)
	} else {
		out = strings.Replace(out, id[1], "CGROUP", 1)
		out = strings.Replace(out, cg.Rel, "vmfork/MACHINE", 1)
	}
	golden(t, "user_allow.nft", out)
	if err := h.Remove("web-1"); err != nil {
		t.Fatal(err)
	}
}

func TestApplyErrors(t *testing.T) {
	_, h := netns(t)
	r := compileSpec(t, "network: {egress: none}")
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"empty machine", h.ApplyBridge("", Bridge{Tap: "vm0"}, r), "empty machine name"},
		{"bad machine", h.ApplyBridge("Web 1", Bridge{Tap: "vm0"}, r), `machine "Web 1"`},
		{"no tap", h.ApplyBridge("web", Bridge{Tap: "nosuchtap"}, r), "tap nosuchtap does not exist"},
		{"not a port", h.ApplyBridge("web", Bridge{Tap: "vm0p"}, r), "tap vm0p is not a port of a bridge"},
		{"empty tap", h.ApplyBridge("web", Bridge{}, r), `tap "" is not an interface name`},
		{"zero rules", h.ApplyBridge("web", Bridge{Tap: "vm0"}, Rules{}), "use Compile"},
		{"no cgroup", h.ApplyUser("web", User{}, r), "no cgroup"},
		{"gone cgroup", h.ApplyUser("web", User{Cgroup: &Cgroup{Path: "/sys/fs/cgroup/unified/vmfork/nosuch", Rel: "vmfork/nosuch"}}, r),
			"cgroup vmfork/nosuch does not exist"},
		{"empty machine remove", h.Remove(""), "empty machine name"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) || strings.Contains(tc.err.Error(), "\n") {
			t.Errorf("%s: %v, want one line with %q", tc.name, tc.err, tc.want)
		}
	}
	if _, err := h.List(""); err == nil {
		t.Error("List of an empty machine name: no error")
	}
}

func TestCheck(t *testing.T) {
	ns, h := netns(t)
	if err := h.CheckBridge(); err != nil {
		t.Errorf("CheckBridge: %v", err)
	}
	if err := h.CheckUser(); err != nil {
		t.Errorf("CheckUser: %v", err)
	}
	// The probes leave nothing behind.
	if rs := nft(t, ns, "list", "ruleset"); strings.TrimSpace(rs) != "" {
		t.Errorf("after the probes, the ruleset is:\n%s", rs)
	}
}

func TestFlushErrors(t *testing.T) {
	for errno, unavailable := range map[syscall.Errno]bool{
		syscall.EPERM: true, syscall.EPROTO: true, syscall.ENOENT: true, syscall.EOPNOTSUPP: true,
		syscall.EAFNOSUPPORT: true, syscall.EINVAL: false, syscall.ENOBUFS: false,
	} {
		err := classify(fmt.Errorf("conn.Receive: %w", errors.Join(errno, errno)), "apply")
		if errors.Is(err, ErrUnavailable) != unavailable || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, ErrUnavailable %v, want %v, one line", errno, err, errors.Is(err, ErrUnavailable), unavailable)
		}
	}
	if err := classify(nil, "apply"); err != nil {
		t.Errorf("no error: %v", err)
	}
	if err := classify(errors.New("a\nb"), "apply"); strings.Contains(err.Error(), "\n") {
		t.Errorf("%q is not one line", err)
	}
}
