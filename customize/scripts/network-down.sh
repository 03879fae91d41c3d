# network-down.sh: the network step's first part (network.go, NetworkStep),
# run while the host holds the child's link down. It finds what configures
# the NIC, stops it without a DHCPRELEASE, flushes the inherited addresses,
# empties the lease files, gives the NIC its new MAC and, in mode static,
# its address.
#
# Runs:     a part of the identity batch (batch-head.sh), in a subshell;
#           set -e. $R is the root of the guest's files ("" in a guest).
# Inputs:   $1 the NIC; $2 its new MAC; $3 the mode: dhcp, static or none;
#           $4 the static address in CIDR form, $5 the gateway, $6 the DNS
#           servers, space-separated (mode static; else empty); $7 1 when
#           the spec has its own DHCP command, else 0. $8, $9 and $10 are
#           what the host read in the source before the freeze (Facts): the
#           MAC NIC $1 had ("" when the host found the NIC in the child), the
#           DHCP clients as "PID:NAME ..." ("0": none ran, "-": unknown, scan
#           /proc) and the first one's command line. PATH from the batch.
# Outputs:  stdout: one line, what it did (the step's detail). Exit 0;
#           101 when the guest lacks what the mode needs or its source
#           changed its network while it was forked, with the reason, and
#           what to do, as stderr's last line; anything else: a command
#           failed. Leaves /run/.vmfork-network, shell assignments of mgr,
#           dhc, ifindex and cmd, for network-up.sh.
# Must not: send a DHCPRELEASE (the lease is the source's) or anything
#           with the source's MAC (the host holds the link down until the
#           next part); touch a NIC other than $1; replace a file it empties
#           or rewrites (it truncates in place, keeping mode and owner).
#
# Down, new MAC, up: the kernel derives new IPv6 link-local addresses from
# the new MAC when the link comes up, instead of keeping the parent's;
# "address X up" sets the address before the flags, in both busybox's ip and
# iproute2's (the kernel's do_setlink). IPv4 addresses survive that, routes
# through the interface do not, so mode none puts the default routes back.
# Each process costs tens of milliseconds in a fresh child under TCG, so
# the script reads /sys and /proc with builtins.
#
# shellcheck disable=SC1007 # "a= b=" sets each to empty, on purpose
# shellcheck disable=SC2086,SC2231 # $R (empty, or a test's directory) and the lists ($pids, $fdhcp, $dns) split on purpose
# shellcheck disable=SC2209 # mgr=nm is the word nm, not nm's output
# shellcheck disable=SC3013 # test -ef: busybox ash, dash and bash all have it

set -e
nic=$1 mac=$2 mode=$3 addr=$4 gw=$5 dns=$6 custom=$7 fmac=$8 fdhcp=$9 fcmd=${10}
state=$R/run/.vmfork-network
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
fi
