//go:build integration

package tests

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDebianGuestVariants boots the stock Debian 12 guest in each variant, one
// after another, and checks that each is the system its kernel command line
// asks for: the agent answers, systemd finishes booting, sshd listens,
// python3 runs, the variant's DHCP client (and no other) runs and got an
// address, and dbus runs or is absent.
func TestDebianGuestVariants(t *testing.T) {
	d := debianGuest(t)
	if len(d.Variants) != 4 {
		t.Fatalf("got variants %v, want ifupdown/networkd × dbus/nodbus", d.variantNames())
	}
	for _, v := range d.Variants {
		t.Run(v.Name, func(t *testing.T) {
			e := newDebianEnv(t) // its cleanup ends this variant's QEMU before the next boots
			start := time.Now()
			e.bootDebian("deb", v)
			t.Logf("%s: vmfork boot to answering agent: %v", v.Name, time.Since(start).Round(time.Millisecond))

			if got := strings.TrimSpace(e.exec("deb", "uname", "-r")); got != d.KernelRelease {
				t.Errorf("uname -r: got %q, want %q", got, d.KernelRelease)
			}
			state := e.settle("deb")
			t.Logf("%s: systemctl is-system-running: %s after %v", v.Name, state, time.Since(start).Round(time.Millisecond))
			// Without a bus systemd-logind cannot start, as on any Debian 12
			// without dbus: that variant is "degraded" by that unit alone.
			wantState, wantFailed := "running", ""
			if !v.DBus {
				wantState, wantFailed = "degraded", "systemd-logind.service"
			}
			if failed := strings.Join(e.failedUnits("deb"), " "); state != wantState || failed != wantFailed {
				t.Errorf("system state %q with failed units %q, want %q with %q", state, failed, wantState, wantFailed)
			}

			if got := e.unitActive("deb", "ssh.service"); got != "active" {
				t.Errorf("ssh.service: got %q, want active", got)
			}
			if out := e.exec("deb", "ss", "-Htln", "sport = :22"); !strings.Contains(out, "LISTEN") {
				t.Errorf("nothing listens on TCP port 22: ss says %q", out)
			}
			if got := strings.TrimSpace(e.exec("deb", "python3", "-c", "import json; print(json.dumps(6*7))")); got != "42" {
				t.Errorf("python3: got %q, want 42", got)
			}

			addr := e.waitIPv4("deb", 2*time.Minute)
			t.Logf("%s: eth0 %s", v.Name, strings.TrimSpace(addr))
			dhclient := e.vmfork("exec", "deb", "--", "pgrep", "-x", "dhclient")
			networkd := e.unitActive("deb", "systemd-networkd.service")
			switch v.Network {
			case "ifupdown":
				if dhclient.code != 0 {
					t.Errorf("no dhclient process: %s", dhclient)
				}
				if got := e.unitActive("deb", "networking.service"); got != "active" {
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
				leases := e.vmfork("exec", "deb", "--", "sh", "-c", "cat /run/systemd/netif/leases/*")
				if leases.code != 0 || !strings.Contains(leases.stdout, "ADDRESS=") {
					t.Errorf("systemd-networkd keeps no DHCPv4 lease: %s", leases)
				}
			}

			bus := e.vmfork("exec", "deb", "--", "test", "-S", "/run/dbus/system_bus_socket")
			dbus := e.unitActive("deb", "dbus.service")
			if v.DBus {
				if dbus != "active" || bus.code != 0 {
					t.Errorf("dbus.service %q, system bus socket test: %s; want active with a socket", dbus, bus)
				}
				if host := e.vmfork("exec", "deb", "--", "hostnamectl", "hostname"); host.code != 0 {
					t.Errorf("hostnamectl with dbus: %s", host)
				}
			} else {
				if dbus == "active" || bus.code == 0 {
					t.Errorf("dbus.service %q, system bus socket present: %v; want no bus", dbus, bus.code == 0)
				}
				if host := e.vmfork("exec", "deb", "--", "hostnamectl", "hostname"); host.code == 0 ||
					!strings.Contains(host.stderr, "bus") {
					t.Errorf("hostnamectl without dbus: %s; want it to fail finding no bus", host)
				}
			}
		})
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
