# network-up.sh: the network step's second part (network.go, NetworkStep),
# run once the host has raised the link: a fresh DHCP exchange by what
# network-down.sh found configured the NIC (systemd-networkd,
# NetworkManager, the DHCP client that ran, restarted with its own command
# line), or by the spec's command, or by udhcpc -q, dhclient or dhcpcd,
# whichever the guest has. Then a gratuitous ARP: with arp_notify set, the
# kernel sends one for each IPv4 address when the MAC is set, even to the
# one it has.
#
# Runs:     a part of the identity batch (batch-head.sh), in a subshell,
#           the first of a batch of its own (Part.LinkUp). $R is the root of
#           the guest's files ("" in a guest).
# Inputs:   $1 the NIC; $2 its MAC (already set); $3 seconds it may wait for
#           a lease (the step's timeout, less a second); $4... the spec's
#           DHCP command, when it has one. /run/.vmfork-network from
#           network-down.sh (sourced). PATH from the batch.
# Outputs:  stdout: one line, what it did (joined to the first part's in the
#           step's detail). Exit 0; 101 when no lease came or the guest has
#           no DHCP client, with the reason as stderr's last line and the
#           client's last lines. A client's output goes to
#           /run/.vmfork-dhcp.log; udhcpc's event script is
#           /run/.vmfork-udhcpc.script.
# Must not: wait longer than $3 seconds for a lease; set any address but
#           the lease's; touch a NIC other than $1.
#
# shellcheck disable=SC1007 # "a= b=" sets each to empty, on purpose
# shellcheck disable=SC1091 # /run/.vmfork-network is network-down.sh's, written at run time
# shellcheck disable=SC2016 # the udhcpc event script is written with its own $ references

nic=$1 mac=$2 to=$3
shift 3
mgr= dhc= ifindex= cmd=
[ -r "$R/run/.vmfork-network" ] && . "$R/run/.vmfork-network"
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
printf '%s\n' "$how"
