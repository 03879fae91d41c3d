//go:build integration

package tests

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/tests/bench"
)

// BenchmarkNetworkChain times the identity chain, per step, of one-child
// forks on the networks users run, for both guests, in one run (issue 29):
// QEMU's user network (DHCP answered inside QEMU), a bridge with a dnsmasq of
// its own in a network namespace (newBridgeNet: --no-ping, as vmfork's docs
// tell users to run theirs), the same bridge with dnsmasq's default ping
// check and with STP on as libvirt's default network has it (the same
// sources; dnsmasq restarted or STP switched on for those forks), and an
// isolated libvirt network, whose dnsmasq runs libvirt's own configuration
// (which pings too), joined by the embedded driver through its bridge. The rounds go
// round-robin over the six sources, so that the host's load falls on all of
// them alike. Besides the medians of every step, it reports how many DHCP
// discovers each child's client sent (from the guest's
// /run/.vmfork-dhcp.log): one each means no exchange was lost.
//
//	go test -tags integration -run '^$' -bench BenchmarkNetworkChain -benchtime 3x ./tests/
//
// (VMFORK_DEBIAN_GUEST set adds the Debian guest: its user-network source is
// a child of the shared template, the others are booted on their network,
// variant ifupdown-nodbus, as the template's.)
func BenchmarkNetworkChain(b *testing.B) {
	type source struct {
		label string
		e     *env
		name  string
		steps map[string][]float64
		chain []float64
		ready []float64
		disc  []float64
		how   string
		// mode is how the bridge's forks find the bridge: "" as made,
		// "ping" with dnsmasq's ping check, "stp" with STP on (setMode).
		mode string
	}
	br := newBridgeNet(b)
	lv := newLibvirtNet(b)
	var srcs []*source
	add := func(label string, e *env, name string) *source {
		s := &source{label: label, e: e, name: name, steps: map[string][]float64{}}
		srcs = append(srcs, s)
		return s
	}
	{
		e := newEnv(b)
		e.boot("src")
		add("busybox, user", e, "src")
		e = newEnv(b)
		br.inNamespace(b, e)
		e.boot("src", "--network", "bridge="+br.bridge)
		add("busybox, bridge", e, "src")
		add("busybox, bridge+ping", e, "src").mode = "ping"
		add("busybox, bridge+stp", e, "src").mode = "stp"
		e = newEnv(b)
		e.boot("src", "--network", "bridge="+lv.bridge)
		add("busybox, libvirt", e, "src")
	}
	if os.Getenv("VMFORK_DEBIAN_GUEST") != "" {
		d := newDebianEnv(b)
		d.forkDebian("deb")
		add("debian, user", d.env, "deb")
		v := d.deb.variant(b, "ifupdown-nodbus")
		db := newDebianEnv(b)
		br.inNamespace(b, db.env)
		db.bootDebian("deb", v, "--network", "bridge="+br.bridge)
		add("debian, bridge", db.env, "deb")
		add("debian, bridge+ping", db.env, "deb").mode = "ping"
		add("debian, bridge+stp", db.env, "deb").mode = "stp"
		dl := newDebianEnv(b)
		dl.bootDebian("deb", v, "--network", "bridge="+lv.bridge)
		add("debian, libvirt", dl.env, "deb")
		for _, x := range []*debianEnv{d, db, dl} {
			x.settle("deb")
			x.waitIPv4("deb", 2*time.Minute)
		}
	}
	// The forks on the bridge in another mode come last in each round,
	// with one switch there and one back.
	shown := slices.Clone(srcs)
	sort.SliceStable(srcs, func(i, j int) bool { return srcs[i].mode < srcs[j].mode })
	mode := ""
	setMode := func(m string) {
		if m == mode {
			return
		}
		switch mode {
		case "ping":
			br.stopDNSMasq()
			br.startDNSMasq(b, false)
		case "stp":
			br.setSTP(b, false)
		}
		switch m {
		case "ping":
			br.stopDNSMasq()
			br.startDNSMasq(b, true)
		case "stp":
			br.setSTP(b, true)
		}
		mode = m
		// dnsmasq bound and listening before the next child asks.
		time.Sleep(500 * time.Millisecond)
	}
	for i := 0; i < b.N; i++ {
		for _, s := range srcs {
			setMode(s.mode)
			name := fmt.Sprintf("c%d", i)
			res, _ := s.e.forkID(0, s.name, name)
			c := res.Children[0]
			for _, st := range c.Identity.Steps {
				s.steps[st.Name] = append(s.steps[st.Name], st.DurationMS)
			}
			s.chain = append(s.chain, c.Identity.ElapsedMS)
			s.ready = append(s.ready, c.ReadyMS)
			s.how = c.Identity.step("vmfork.network").Detail
			s.disc = append(s.disc, float64(discovers(s.e.exec(name, "cat", "/run/.vmfork-dhcp.log"))))
			s.e.ok("rm", "--force", name)
		}
	}
	setMode("")
	med := bench.Median
	fmt.Printf("\nidentity chain per network, %d one-child forks per source (medians, ms)\n", b.N)
	fmt.Printf("%-22s", "step")
	for _, s := range shown {
		fmt.Printf(" %20s", s.label)
	}
	fmt.Println()
	var names []string
	for _, s := range shown {
		for n := range s.steps {
			if !contains(names, n) {
				names = append(names, n)
			}
		}
	}
	sort.Strings(names)
	row := func(label string, f func(s *source) float64) {
		fmt.Printf("%-22s", label)
		for _, s := range shown {
			fmt.Printf(" %20.1f", f(s))
		}
		fmt.Println()
	}
	for _, n := range names {
		row(n, func(s *source) float64 { return med(s.steps[n]) })
	}
	row("chain", func(s *source) float64 { return med(s.chain) })
	row("child ready", func(s *source) float64 { return med(s.ready) })
	row("dhcp discovers", func(s *source) float64 { return med(s.disc) })
	for _, s := range shown {
		fmt.Printf("%s: network %.0f ms (min %.0f, max %.0f), chain %.0f-%.0f ms: %s\n", s.label, med(s.steps["vmfork.network"]),
			minOf(s.steps["vmfork.network"]), maxOf(s.steps["vmfork.network"]), minOf(s.chain), maxOf(s.chain), s.how)
		b.ReportMetric(med(s.chain), strings.ReplaceAll(s.label, ", ", "-")+"-chain-ms")
	}
}

// discovers counts the DHCP discovers in a DHCP client's log: dhclient -v
// writes "DHCPDISCOVER on eth0 ...", udhcpc "broadcasting discover" (older
// ones "sending discover").
func discovers(log string) int {
	return strings.Count(log, "DHCPDISCOVER on") + strings.Count(log, "broadcasting discover") + strings.Count(log, "sending discover")
}

func minOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	m := v[0]
	for _, x := range v {
		m = min(m, x)
	}
	return m
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}
