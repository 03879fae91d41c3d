//go:build integration

package tests

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// checkDebianVariant checks that the Debian guest booted as machine name is
// the system variant v's kernel command line asks for: the agent answers,
// systemd finished booting (state, from settle), sshd listens, python3 runs,
// the variant's DHCP client (and no other) runs and got an address, and dbus
// runs or is absent. TestIdentityDebian calls it on each variant's parent
// before the fork, so each variant boots once in the suite.
func checkDebianVariant(t *testing.T, e *debianEnv, name string, v debianVariant, state string) {
	t.Helper()
	if got := strings.TrimSpace(e.exec(name, "uname", "-r")); got != e.deb.KernelRelease {
		t.Errorf("uname -r: got %q, want %q", got, e.deb.KernelRelease)
	}
	// Without a bus systemd-logind cannot start, as on any Debian 12
	// without dbus: that variant is "degraded" by that unit alone.
	wantState, wantFailed := "running", ""
	if !v.DBus {
		wantState, wantFailed = "degraded", "systemd-logind.service"
	}
	if failed := strings.Join(e.failedUnits(name), " "); state != wantState || failed != wantFailed {
		t.Errorf("system state %q with failed units %q, want %q with %q", state, failed, wantState, wantFailed)
	}

	if got := e.unitActive(name, "ssh.service"); got != "active" {
		t.Errorf("ssh.service: got %q, want active", got)
	}
	if out := e.exec(name, "ss", "-Htln", "sport = :22"); !strings.Contains(out, "LISTEN") {
		t.Errorf("nothing listens on TCP port 22: ss says %q", out)
	}
	if got := strings.TrimSpace(e.exec(name, "python3", "-c", "import json; print(json.dumps(6*7))")); got != "42" {
		t.Errorf("python3: got %q, want 42", got)
	}

	addr := e.waitIPv4(name, 2*time.Minute)
	t.Logf("%s: eth0 %s", v.Name, strings.TrimSpace(addr))
	dhclient := e.vmfork("exec", name, "--", "pgrep", "-x", "dhclient")
	networkd := e.unitActive(name, "systemd-networkd.service")
	switch v.Network {
	case "ifupdown":
		if dhclient.code != 0 {
			t.Errorf("no dhclient process: %s", dhclient)
		}
		if got := e.unitActive(name, "networking.service"); got != "active" {
			t.Errorf("networking.service: got %q, want active", got)
		}
		if networkd == "active" {
			t.Errorf("systemd-networkd.service is active, want it masked")
		}
	case "networkd":
		if networkd != "active" {
			t.Errorf("systemd-networkd.service: got %q, want active", networkd)
		}
		if dhclient.code == 0 {
			t.Errorf("dhclient runs (pids %q), want only systemd-networkd", strings.TrimSpace(dhclient.stdout))
		}
		// networkd's own record of the lease, not just an address on the
		// link; the file, because networkctl needs the bus.
		leases := e.vmfork("exec", name, "--", "sh", "-c", "cat /run/systemd/netif/leases/*")
		if leases.code != 0 || !strings.Contains(leases.stdout, "ADDRESS=") {
			t.Errorf("systemd-networkd keeps no DHCPv4 lease: %s", leases)
		}
	}

	bus := e.vmfork("exec", name, "--", "test", "-S", "/run/dbus/system_bus_socket")
	dbus := e.unitActive(name, "dbus.service")
	if v.DBus {
		if dbus != "active" || bus.code != 0 {
			t.Errorf("dbus.service %q, system bus socket test: %s; want active with a socket", dbus, bus)
		}
		if host := e.vmfork("exec", name, "--", "hostnamectl", "hostname"); host.code != 0 {
			t.Errorf("hostnamectl with dbus: %s", host)
		}
	} else {
		if dbus == "active" || bus.code == 0 {
			t.Errorf("dbus.service %q, system bus socket present: %v; want no bus", dbus, bus.code == 0)
		}
		if host := e.vmfork("exec", name, "--", "hostnamectl", "hostname"); host.code == 0 ||
			!strings.Contains(host.stderr, "bus") {
			t.Errorf("hostnamectl without dbus: %s; want it to fail finding no bus", host)
		}
	}
}

// BenchmarkBootDebian measures vmfork boot until the guest agent answers, for
// the Debian guest (variant ifupdown-nodbus, the minimal server) next
// to the busybox guest in the same run, alternating, and reports the medians
// and their ratio. It needs VMFORK_GUEST and VMFORK_DEBIAN_GUEST.
func BenchmarkBootDebian(b *testing.B) {
	d := debianGuest(b)
	v := d.variant(b, "ifupdown-nodbus")
	var busybox, debian []float64
	for i := 0; b.Loop(); i++ {
		e := newEnv(b)
		start := time.Now()
		e.boot(fmt.Sprint("bb", i))
		busybox = append(busybox, time.Since(start).Seconds())
		e.cleanup()

		de := newDebianEnv(b)
		start = time.Now()
		de.bootDebian(fmt.Sprint("deb", i), v)
		debian = append(debian, time.Since(start).Seconds())
		de.cleanup()
	}
	bb, deb := median(busybox), median(debian)
	b.ReportMetric(bb, "busybox_agent_s")
	b.ReportMetric(deb, "debian_agent_s")
	b.ReportMetric(deb/bb, "debian/busybox")
	b.ReportMetric(0, "ns/op") // a boot's wall time is in the metrics above
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
