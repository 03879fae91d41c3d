package customize

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// NetworkMode says how a child gets its addresses once it has its own MAC.
type NetworkMode string

// Network modes.
const (
	NetworkDHCP   NetworkMode = "dhcp"   // renew the DHCP lease (the default)
	NetworkStatic NetworkMode = "static" // one address per child from the spec
	NetworkNone   NetworkMode = "none"   // only the MAC changes
)

// NetworkSpec configures the network step.
type NetworkSpec struct {
	// Mode defaults to static when Addresses are given, else dhcp.
	Mode NetworkMode `json:"mode,omitempty" yaml:"mode,omitempty"`
	// Interface is the guest's NIC; by default the one non-loopback
	// interface, or the one with the source's MAC.
	Interface string `json:"interface,omitempty" yaml:"interface,omitempty"`
	// Addresses are static addresses in CIDR form, one per child in the
	// order of the fork (child n gets the n-th).
	Addresses []string `json:"addresses,omitempty" yaml:"addresses,omitempty"`
	Gateway   string   `json:"gateway,omitempty" yaml:"gateway,omitempty"`
	DNS       []string `json:"dns,omitempty" yaml:"dns,omitempty"`
	// DHCPCommand replaces the DHCP client vmfork finds in the guest
	// (udhcpc, dhcpcd or dhclient); "{interface}" in it is replaced.
	DHCPCommand []string `json:"dhcp_command,omitempty" yaml:"dhcp_command,omitempty"`
}

// EffectiveMode returns the mode, filling in the default.
func (n NetworkSpec) EffectiveMode() NetworkMode {
	switch {
	case n.Mode != "":
		return n.Mode
	case len(n.Addresses) > 0:
		return NetworkStatic
	}
	return NetworkDHCP
}

func (n NetworkSpec) validate() error {
	mode := n.EffectiveMode()
	switch mode {
	case NetworkDHCP, NetworkStatic, NetworkNone:
	default:
		return fmt.Errorf("network mode %q: want dhcp, static or none", n.Mode)
	}
	if mode == NetworkStatic && len(n.Addresses) == 0 {
		return fmt.Errorf("network mode static needs addresses")
	}
	if mode != NetworkStatic && (len(n.Addresses) > 0 || n.Gateway != "" || len(n.DNS) > 0) {
		return fmt.Errorf("network addresses, gateway and dns need mode static, not %s", mode)
	}
	if len(n.DHCPCommand) > 0 && mode != NetworkDHCP {
		return fmt.Errorf("network dhcp_command needs mode dhcp, not %s", mode)
	}
	if n.Interface != "" && !validIfName(n.Interface) {
		return fmt.Errorf("network interface %q is not a valid interface name", n.Interface)
	}
	seen := map[netip.Addr]bool{}
	for _, a := range n.Addresses {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return fmt.Errorf("network address %q: want an address with a prefix length, such as 10.0.2.21/24", a)
		}
		if seen[p.Addr()] {
			return fmt.Errorf("network address %s is given twice", p.Addr())
		}
		seen[p.Addr()] = true
	}
	if n.Gateway != "" {
		if _, err := netip.ParseAddr(n.Gateway); err != nil {
			return fmt.Errorf("network gateway %q is not an IP address", n.Gateway)
		}
	}
	for _, d := range n.DNS {
		if _, err := netip.ParseAddr(d); err != nil {
			return fmt.Errorf("network dns %q is not an IP address", d)
		}
	}
	return nil
}

func validIfName(s string) bool {
	if s == "" || len(s) > 15 {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == '/' || r == ':' || r > '~' {
			return false
		}
	}
	return true
}

// NetworkStep gives the guest its new MAC, then its addresses as n says,
// and leaves it nothing of its source's network identity: the inherited
// DHCP client is stopped without a DHCPRELEASE (the lease is the parent's,
// and the link is down, so nothing leaves the child anyway), the inherited
// addresses are flushed and the lease files (and dhclient's DUID) emptied,
// and a fresh exchange runs with the new MAC and, for systemd-networkd, the
// client identifier of the new machine-id. Afterwards the NIC has exactly
// one IPv4 address, announced with a gratuitous ARP. The MAC changes inside
// the guest (virtio-net's control queue), so QEMU's receive filter follows
// it; the NIC's MAC in QEMU's configuration must stay the template's.
//
// What renews the lease is what configured the NIC before: NetworkManager,
// systemd-networkd, or the DHCP client that ran (dhclient, as ifupdown starts
// it, udhcpc or dhcpcd), restarted with its own command line; a guest where
// none runs (a DHCP client that quit after its lease, as the test guest's
// udhcpc -q) gets udhcpc -q, dhclient or dhcpcd, whichever it has. The
// step's detail names the mechanism.
func NetworkStep(n NetworkSpec) Step {
	return Step{Name: StepNetwork, Timeout: networkTimeout, Parts: n.parts}
}

// netState is where the network step's first part tells the second what
// configures the NIC.
const netState = "/run/.vmfork-network"

func (n NetworkSpec) parts(ctx context.Context, env *Env) ([]*Part, error) {
	c := env.Child
	if _, err := net.ParseMAC(c.MAC); err != nil || c.MAC == "" {
		return nil, fmt.Errorf("no valid MAC chosen for the child (%q)", c.MAC)
	}
	mode := n.EffectiveMode()
	var addr string
	if mode == NetworkStatic {
		if c.Index < 1 || c.Index > len(n.Addresses) {
			return nil, fmt.Errorf("no static address for child %d: the spec lists %d", c.Index, len(n.Addresses))
		}
		addr = n.Addresses[c.Index-1]
	}
	nic, factMAC := n.Interface, ""
	if nic == "" {
		var ok bool
		if nic, factMAC, ok = factNIC(env.Facts, c.OldMACs); !ok {
			var err error
			if nic, err = findNIC(ctx, env.Agent, c.OldMACs); err != nil {
				return nil, err
			}
		}
	}
	var dhcp *DHCPFacts
	if env.Facts != nil {
		dhcp = env.Facts.DHCP
	}
	var cmdline string
	if dhcp != nil {
		cmdline = strings.Join(dhcp.Cmdline, " ")
	}
	env.mac = c.MAC
	custom := "0"
	if len(n.DHCPCommand) > 0 {
		custom = "1"
	}
	var down string
	first := &Part{
		Script: netDownScript,
		Args:   []string{nic, c.MAC, string(mode), addr, n.Gateway, strings.Join(n.DNS, " "), custom, factMAC, dhcp.arg(), cmdline},
		Done: func(env *Env, out string) error {
			down = strings.TrimSpace(out)
			env.Result.MAC = c.MAC
			if mode != NetworkDHCP {
				return n.finish(ctx, env, nic, mode, down)
			}
			return nil
		},
	}
	if mode != NetworkDHCP {
		return []*Part{first}, nil
	}
	wait := networkTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	args := []string{nic, c.MAC, strconv.Itoa(max(1, int(wait.Seconds())-1))}
	for _, s := range n.DHCPCommand {
		args = append(args, strings.ReplaceAll(s, "{interface}", nic))
	}
	// DHCP needs the link, which the caller holds down until the chain
	// ends. The guest has its own MAC now, so it may go out.
	second := &Part{
		Script: netUpScript,
		Args:   args,
		LinkUp: true,
		Done: func(env *Env, out string) error {
			return n.finish(ctx, env, nic, mode, down+"; "+strings.TrimSpace(out))
		},
	}
	return []*Part{first, second}, nil
}

// finish records the NIC's addresses and checks that it has exactly one
// IPv4 address in modes that give it one.
func (n NetworkSpec) finish(ctx context.Context, env *Env, nic string, mode NetworkMode, how string) error {
	addrs, err := addressesOf(context.WithoutCancel(ctx), env.Agent, nic)
	if err != nil {
		return err
	}
	env.Result.Addresses = addrs
	if mode != NetworkNone {
		var v4 []string
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a); err == nil && p.Addr().Is4() {
				v4 = append(v4, a)
			}
		}
		if len(v4) != 1 {
			return fmt.Errorf("%s has %d IPv4 addresses after the network step (%s), want exactly one", nic, len(v4), orNone(strings.Join(v4, " ")))
		}
	}
	env.Detailf("%s %s, %s: %s (%s)", nic, env.Child.MAC, mode, orNone(strings.Join(addrs, " ")), how)
	return nil
}

// netDownScript runs with the link down: it finds what configures NIC $1,
// stops it without a release, flushes the inherited addresses, empties the
// lease files, gives the NIC the MAC $2 and, in mode static ($3), the
// address $4 (gateway $5, DNS $6). $7 is 1 when the spec has its own DHCP
// command. $8, $9 and $10 are what the host read in the source before the
// freeze (Facts): the MAC NIC $1 had ("" when the host found the NIC in the
// child), the DHCP clients as "PID:NAME ..." ("0": none ran, "-": unknown)
// and the first one's command line. It leaves what the second part needs
// in netState and prints what it did.
//
// Down, new MAC, up: the kernel derives new IPv6 link-local addresses from
// the new MAC when the link comes up, instead of keeping the parent's;
// "address X up" sets the address before the flags, in both busybox's ip and
// iproute2's (the kernel's do_setlink). IPv4 addresses survive that, routes
// through the interface do not, so mode none puts the default routes back.
// Each process costs tens of milliseconds in a fresh child under TCG, so
// the script reads /sys and /proc with builtins.
const netDownScript = `set -e
nic=$1 mac=$2 mode=$3 addr=$4 gw=$5 dns=$6 custom=$7 fmac=$8 fdhcp=$9 fcmd=${10}
state=$R` + netState + `
ifindex= mgr= dhc= cmd= how=
read -r ifindex <"$R/sys/class/net/$nic/ifindex" || true
if [ -n "$fmac" ]; then
	a=
	read -r a <"$R/sys/class/net/$nic/address" 2>/dev/null || true
	if [ "$a" != "$fmac" ]; then
		echo "the guest's $nic has MAC ${a:-(none)}, not $fmac as in its source just before the freeze: the source changed its network while it was forked; fork it again" >&2
		exit 101
	fi
fi
# What configures the NIC.
if [ -d $R/run/systemd/system ] && [ -n "$ifindex" ] && [ -r "$R/run/systemd/netif/links/$ifindex" ]; then
	while IFS='=' read -r k v; do
		if [ "$k" = ADMIN_STATE ] && [ "$v" != unmanaged ]; then mgr=networkd; fi
	done <"$R/run/systemd/netif/links/$ifindex"
fi
if [ -r $R/run/NetworkManager/NetworkManager.pid ] && read -r p <$R/run/NetworkManager/NetworkManager.pid &&
	read -r c <"$R/proc/$p/comm" 2>/dev/null && [ "$c" = NetworkManager ]; then
	mgr=nm
fi
pids=
if [ -z "$mgr" ]; then
	# The DHCP clients the host saw in the source, if each still runs
	# under its name; else a scan of /proc.
	scan=
	case $fdhcp in
	-) scan=1 ;;
	0) ;;
	*)
		for pc in $fdhcp; do
			c=
			read -r c <"$R/proc/${pc%%:*}/comm" 2>/dev/null || true
			if [ "$c" != "${pc#*:}" ]; then scan=1; fi
		done
		if [ -z "$scan" ]; then
			set -- $fdhcp
			dhc=${1#*:} cmd=$fcmd
			for pc in $fdhcp; do pids="$pids ${pc%%:*}"; done
		fi
		;;
	esac
	# Kernel threads, most of /proc, have no exe: one stat each instead of
	# reading their comm a byte at a time.
	if [ -n "$scan" ]; then
		for p in $R/proc/[0-9]*; do
			[ -e "$p/exe" ] || continue
			read -r c <"$p/comm" 2>/dev/null || continue
			case $c in
			dhclient | udhcpc | dhcpcd) dhc=$c pids="$pids ${p#"$R"/proc/}" ;;
			esac
		done
	fi
	if [ -n "$scan" ] && [ -n "$pids" ]; then
		set -- $pids
		# tr, a process: every shell's read drops the NUL bytes between
		# the arguments.
		cmd=$(tr '\0' ' ' <"$R/proc/$1/cmdline" 2>/dev/null || true)
	fi
	if [ -n "$pids" ]; then
		set -- $cmd
		# Its program, found on PATH as command -v would, without the
		# fork of a command substitution.
		p=
		case ${1-} in
		/*) p=$R$1 ;;
		?*)
			IFS=: d=
			for d in $PATH; do
				if [ -f "${d:-.}/$1" ] && [ -x "${d:-.}/$1" ]; then p=${d:-.}/$1 && break; fi
			done
			unset IFS
			;;
		esac
		if [ "$mode" = dhcp ] && [ "$custom" != 1 ] && { [ -z "$p" ] || [ ! -x "$p" ]; }; then
			echo "the guest has no ${1:-$dhc} any more, the DHCP client ($dhc) that configured $nic: install it (isc-dhcp-client for dhclient), set network.dhcp_command, use --network static or none, or --skip-step vmfork.network" >&2
			exit 101
		fi
	fi
fi
if [ "$mode" = static ] && [ "$mgr" = nm ]; then
	echo "static addresses on a NetworkManager guest are not supported: use --network dhcp or none, or --skip-step vmfork.network" >&2
	exit 101
fi
routes=
if [ "$mode" = none ]; then
	routes=$(ip -4 route show default dev "$nic" 2>/dev/null || true)
else
	# Stop what holds the parent's lease, without a DHCPRELEASE: SIGKILL
	# runs no release and no script; networkd and NetworkManager restart
	# below, with the link down, so a release they send goes nowhere.
	if [ -n "$pids" ]; then
		kill -KILL $pids 2>/dev/null || true
		how="$dhc (pid${pids}) stopped without a release"
	fi
	case $mgr in
	nm)
		systemctl stop NetworkManager.service </dev/null >/dev/null 2>&1 || true
		how="NetworkManager stopped"
		;;
	esac
	for f in $R/var/lib/dhcp/dhclient*.leases $R/var/lib/dhclient/*.leases $R/var/lib/NetworkManager/*"$nic"*.lease \
		$R/var/lib/dhcpcd/*"$nic"*.lease $R/var/lib/udhcpc/*"$nic"* "$R/run/systemd/netif/leases/$ifindex"; do
		if [ -f "$f" ]; then : >"$f"; fi
	done
	how="${how:+$how; }lease files emptied"
fi
if [ -w "$R/proc/sys/net/ipv4/conf/$nic/arp_notify" ]; then echo 1 >"$R/proc/sys/net/ipv4/conf/$nic/arp_notify"; fi
# Down by writing the NIC's flags without IFF_UP to sysfs, which is what
# ip link set down does (the kernel's dev_change_flags) without a process;
# ip where the file is missing or does not take it.
fl=
read -r fl <"$R/sys/class/net/$nic/flags" 2>/dev/null || true
case $fl in 0x[0-9a-fA-F]*) ;; *) fl= ;; esac
if [ -z "$fl" ] || ! { echo "$((fl & ~1))" >"$R/sys/class/net/$nic/flags"; } 2>/dev/null; then
	ip link set dev "$nic" down
fi
# The flush and the new MAC in one process where ip is iproute2's, whose
# -batch reads commands from stdin (each ip costs ~150 ms in a fresh Debian
# child under TCG); busybox's ip (the shell's applet, or ip a link to
# busybox) has no -batch. Names with characters -batch would parse
# otherwise (quotes, #) and an ip whose batch fails take the two commands.
ipb=
if [ "$mode" != none ] && ! [ "$R/proc/$$/exe" -ef $R/bin/busybox ]; then
	case $nic$mac in *[!A-Za-z0-9._@:-]*) ;; *)
		IFS=: d=
		for d in $PATH; do
			if [ -f "${d:-.}/ip" ] && [ -x "${d:-.}/ip" ]; then
				if ! [ "${d:-.}/ip" -ef $R/bin/busybox ]; then ipb=1; fi
				break
			fi
		done
		unset IFS
		;;
	esac
fi
if [ -z "$ipb" ] || ! ip -4 -batch - >/dev/null 2>&1 <<EOF
addr flush dev $nic
link set dev $nic address $mac up
EOF
then
	if [ "$mode" != none ]; then ip -4 addr flush dev "$nic"; fi
	ip link set dev "$nic" address "$mac" up
fi
case $mode in
static)
	case $addr in *:*) fam=-6 ;; *) fam=-4 ;; esac
	if [ "$mgr" = networkd ]; then
		# networkd would put its DHCP lease back: a runtime .network
		# file that sorts first gives it the static address instead.
		mkdir -p $R/run/systemd/network
		{
			printf '[Match]\nName=%s\n[Network]\nDHCP=no\nAddress=%s\n' "$nic" "$addr"
			if [ -n "$gw" ]; then printf 'Gateway=%s\n' "$gw"; fi
			for s in $dns; do printf 'DNS=%s\n' "$s"; done
		} >"$R/run/systemd/network/00-vmfork-$nic.network"
		systemctl restart systemd-networkd.service </dev/null >/dev/null
		how="${how:+$how; }systemd-networkd with $R/run/systemd/network/00-vmfork-$nic.network"
	else
		ip addr add "$addr" dev "$nic"
		if [ -n "$gw" ]; then ip route replace default via "$gw" dev "$nic"; fi
		how="${how:+$how; }ip addr add"
	fi
	if [ -n "$dns" ]; then
		for s in $dns; do echo "nameserver $s"; done >$R/etc/resolv.conf.vmfork
		cat $R/etc/resolv.conf.vmfork >$R/etc/resolv.conf
		rm -f $R/etc/resolv.conf.vmfork
	fi
	;;
none)
	printf '%s\n' "$routes" | while read -r r; do
		if [ -n "$r" ]; then ip route replace $r dev "$nic"; fi
	done
	how="address kept"
	;;
dhcp)
	if [ "$mgr" = networkd ]; then
		# networkd's DHCP client identifier comes from /etc/machine-id,
		# which it reads when it starts: a restart after vmfork.machine-id
		# gives the child its own. The old one is stopped before the link
		# goes up, or it would ask with the parent's id; the new one is
		# waited for in the second part, with its lease.
		systemctl stop systemd-networkd.service </dev/null >/dev/null
		systemctl --no-block start systemd-networkd.service </dev/null >/dev/null
		how="${how:+$how; }systemd-networkd restarted for a client id from the new machine-id"
	fi
	;;
esac
{
	printf 'mgr=%s\ndhc=%s\nifindex=%s\n' "$mgr" "$dhc" "$ifindex"
	printf 'cmd=%s\n' "'$cmd'"
} >"$state"
if [ "$custom" = 1 ] || [ "$mode" != dhcp ] || [ -n "$mgr" ] || [ -n "$cmd" ] || command -v udhcpc >/dev/null 2>&1 ||
	command -v dhclient >/dev/null 2>&1 || command -v dhcpcd >/dev/null 2>&1; then
	printf '%s\n' "${how:-MAC changed}"
else
	echo "the guest has no DHCP client (systemd-networkd, NetworkManager, dhclient, udhcpc or dhcpcd): install isc-dhcp-client, set network.dhcp_command, use --network static or none, or --skip-step vmfork.network" >&2
	exit 101
fi`

// netUpScript runs once the link is up: a fresh DHCP exchange on NIC $1
// (MAC $2) within $3 seconds, by what netDownScript found, or by the
// spec's command ($4...). Then a gratuitous ARP: with arp_notify set, the
// kernel sends one for each IPv4 address when the MAC is set, even to the
// one it has.
const netUpScript = `nic=$1 mac=$2 to=$3
shift 3
mgr= dhc= ifindex= cmd=
[ -r "$R` + netState + `" ] && . "$R` + netState + `"
log=$R/run/.vmfork-dhcp.log
fail() {
	echo "$1: $(tail -n 3 "$log" 2>/dev/null | tr '\n' ' ')" >&2
	exit 101
}
# wait_for TEST...: poll every 50 ms until TEST succeeds or $to seconds pass.
wait_for() {
	i=$((to * 20))
	until "$@"; do
		i=$((i - 1))
		if [ "$i" -le 0 ]; then return 1; fi
		sleep 0.05
	done
}
has_v4() { case $(ip -4 -o addr show dev "$nic" scope global 2>/dev/null) in *inet*) return 0 ;; esac; return 1; }
# The kernel applies a carrier change in its link-watch work, up to a second
# after it, and drops what is sent before: a client's first DHCPDISCOVER
# would be lost, and ISC dhclient waits seconds before it tries again. So
# wait (bounded) until the NIC's operstate says up.
op_up() { read -r o <"$R/sys/class/net/$nic/operstate" 2>/dev/null && { [ "$o" = up ] || [ "$o" = unknown ]; }; }
n=0
until op_up || [ "$n" -ge 60 ]; do
	sleep 0.02
	n=$((n + 1))
done
if [ $# -gt 0 ]; then
	"$@" </dev/null >"$log" 2>&1 || fail "network.dhcp_command $1 failed"
	how="dhcp_command $1"
elif [ "$mgr" = networkd ]; then
	wait_for test -s "$R/run/systemd/netif/leases/$ifindex" || fail "systemd-networkd got no DHCP lease on $nic in ${to}s"
	wait_for has_v4 || fail "systemd-networkd did not configure its lease on $nic in ${to}s"
	how="systemd-networkd lease"
elif [ "$mgr" = nm ]; then
	systemctl start NetworkManager.service </dev/null >"$log" 2>&1 || fail "systemctl start NetworkManager failed"
	wait_for has_v4 || fail "NetworkManager got no IPv4 address on $nic in ${to}s"
	how="NetworkManager restarted"
elif [ -n "$cmd" ]; then
	# The client that ran, started as it was (ifupdown's dhclient
	# command line, say); it goes to the background once it has a lease.
	set -f
	# shellcheck disable=SC2086 # its arguments, split as they were
	set -- $cmd
	set +f
	p=$1
	shift
	case $p in /*) p=$R$p ;; esac
	"$p" "$@" </dev/null >"$log" 2>&1 || fail "$dhc failed"
	set -- "$p" "$@"
	how="$dhc restarted as it ran ($*)"
elif command -v udhcpc >/dev/null 2>&1; then
	# One exchange, as a guest whose udhcpc quit after its lease did at
	# boot. Patient (up to 4 exchanges of 3 discovers 2 s apart, within the
	# step's 30 s): libvirt's dnsmasq pings each address for ~3 s before it
	# offers it, one offer at a time, so the third of three children waits
	# ~9 s.
	# vmfork's event script applies the lease with two ip commands
	# (the first part flushed the old addresses).
	s=$R/run/.vmfork-udhcpc.script
	{
		printf '#!/bin/sh\ncase $1 in\nbound|renew)\n'
		printf '\tip addr add "$ip/$mask" broadcast + dev "$interface" || exit 1\n'
		printf '\tfor r in $router; do ip route replace default via "$r" dev "$interface"; break; done\n'
		printf '\tif [ -n "$dns" ]; then for d in $dns; do echo "nameserver $d"; done >$R/etc/resolv.conf; fi\n;;\nesac\n'
	} >"$s"
	chmod 700 "$s"
	# A fresh exchange after one whose request went unanswered (seen with
	# several children asking libvirt's dnsmasq at once).
	n=0
	until udhcpc -i "$nic" -n -q -t 3 -T 2 -s "$s" </dev/null >"$log" 2>&1; do
		n=$((n + 1))
		[ "$n" -lt 4 ] || fail "udhcpc got no lease on $nic"
	done
	how="udhcpc -q"
elif command -v dhclient >/dev/null 2>&1; then
	dhclient -4 -1 -pf "$R/run/dhclient.$nic.pid" -lf "$R/var/lib/dhcp/dhclient.$nic.leases" "$nic" </dev/null >"$log" 2>&1 || fail "dhclient got no lease on $nic"
	how="dhclient"
elif command -v dhcpcd >/dev/null 2>&1; then
	dhcpcd -4 -w "$nic" </dev/null >"$log" 2>&1 || fail "dhcpcd got no lease on $nic"
	how=dhcpcd
else
	echo "the guest has no DHCP client (systemd-networkd, NetworkManager, dhclient, udhcpc or dhcpcd): install isc-dhcp-client, set network.dhcp_command, use --network static or none, or --skip-step vmfork.network" >&2
	exit 101
fi
if [ -w "$R/proc/sys/net/ipv4/conf/$nic/arp_notify" ]; then
	ip link set dev "$nic" address "$mac" && how="$how; gratuitous ARP (arp_notify)"
elif command -v arping >/dev/null 2>&1; then
	a=$(ip -4 -o addr show dev "$nic" scope global | { read -r _ _ _ a _; echo "${a%/*}"; })
	arping -U -c 1 -I "$nic" "$a" </dev/null >/dev/null 2>&1 &
	how="$how; gratuitous ARP (arping)"
fi
printf '%s\n' "$how"`

// findNIC returns the guest's NIC: its only non-loopback interface, or the
// one with one of the MACs the child inherited.
func findNIC(ctx context.Context, a Agent, old []string) (string, error) {
	nic, _, err := findNICMAC(ctx, a, old)
	return nic, err
}

// findNICMAC is findNIC that also returns the NIC's MAC.
func findNICMAC(ctx context.Context, a Agent, old []string) (string, string, error) {
	ifs, err := a.NetworkInterfaces(ctx)
	if err != nil {
		return "", "", fmt.Errorf("list guest interfaces: %w", err)
	}
	var cands []qmp.NetworkInterface
	for _, i := range ifs {
		if i.Name == "lo" || i.HardwareAddress == "" || i.HardwareAddress == "00:00:00:00:00:00" {
			continue
		}
		for _, m := range old {
			if strings.EqualFold(i.HardwareAddress, m) {
				return i.Name, strings.ToLower(i.HardwareAddress), nil
			}
		}
		cands = append(cands, i)
	}
	switch len(cands) {
	case 1:
		return cands[0].Name, strings.ToLower(cands[0].HardwareAddress), nil
	case 0:
		return "", "", fmt.Errorf("the guest has no network interface")
	}
	names := make([]string, len(cands))
	for i, c := range cands {
		names[i] = c.Name
	}
	return "", "", fmt.Errorf("the guest has several network interfaces (%s); set network.interface", strings.Join(names, ", "))
}

// factNIC returns the NIC the facts name and the MAC it had there, when
// that MAC is one the child may have.
func factNIC(f *Facts, old []string) (string, string, bool) {
	if f == nil || f.NIC == nil || f.NIC.Name == "" {
		return "", "", false
	}
	for _, m := range old {
		if strings.EqualFold(m, f.NIC.MAC) {
			return f.NIC.Name, strings.ToLower(f.NIC.MAC), true
		}
	}
	return "", "", false
}

// addressesOf returns nic's addresses in CIDR form, without link-local ones.
func addressesOf(ctx context.Context, a Agent, nic string) ([]string, error) {
	ifs, err := a.NetworkInterfaces(ctx)
	if err != nil {
		return nil, fmt.Errorf("list guest interfaces: %w", err)
	}
	var out []string
	for _, i := range ifs {
		if i.Name != nic {
			continue
		}
		for _, ip := range i.IPAddresses {
			addr, err := netip.ParseAddr(ip.Address)
			if err != nil || addr.IsLinkLocalUnicast() {
				continue
			}
			out = append(out, netip.PrefixFrom(addr, ip.Prefix).String())
		}
	}
	return out, nil
}

// ChildMAC returns the MAC for the index-th child of a fork: QEMU's
// 52:54:00 prefix and 24 bits that follow from seed (the template's
// identity) and the index, so siblings never share one. Any MAC in avoid
// (the source's) is stepped over.
func ChildMAC(seed []byte, index int, avoid ...string) string {
	sum := sha256.Sum256(seed)
	base := binary.BigEndian.Uint32(sum[:4])
	for k := uint32(0); ; k++ {
		v := (base + uint32(index) + k<<20) & 0xffffff
		mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", byte(v>>16), byte(v>>8), byte(v))
		clash := false
		for _, a := range avoid {
			clash = clash || strings.EqualFold(a, mac)
		}
		if !clash {
			return mac
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "no address"
	}
	return s
}
