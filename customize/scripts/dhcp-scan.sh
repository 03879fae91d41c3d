# dhcp-scan.sh: finds the DHCP clients that run (facts.go, ReadFacts), the
# scan that network-down.sh does itself when it has no facts.
#
# Runs:     alone, with /bin/sh -c (guest.go, shell), in the source before
#           its freeze.
# Inputs:   none; /proc. PATH and LC_ALL=C.
# Outputs:  stdout: "PID NAME" for each dhclient, udhcpc or dhcpcd process,
#           one a line. Exit 0.
# Must not: start a process (kernel threads, most of /proc, have no exe:
#           one test each instead of reading their comm); change anything.

for p in /proc/[0-9]*; do
	[ -e "$p/exe" ] || continue
	read -r c <"$p/comm" 2>/dev/null || continue
	case $c in
	dhclient | udhcpc | dhcpcd) printf '%s %s\n' "${p#/proc/}" "$c" ;;
	esac
done
