# connections.sh: the connections step's part (contract.go, ConnectionsStep):
# closes every TCP connection the child inherited from its parent's
# instant, before its NIC comes up. Those connections' peers only ever
# talk to the parent; in the child they are dead, and a program writing
# into one would wait minutes for a timeout. ss -K has the kernel destroy
# each socket (SOCK_DESTROY, CONFIG_INET_DIAG_DESTROY): its program gets
# an error at once and can reconnect. The link is down, so the resets the
# kernel sends go nowhere: the peer never hears of it.
#
# Runs:     a part of the identity batch (batch-head.sh), in a subshell,
#           while the child's link is down.
# Inputs:   none.
# Outputs:  stdout: one line, "N closed" (N the inherited connections
#           closed). Exit 0; 2 with the reason on stdout when the guest has
#           no ss (iproute2) to close them with (not 100, which would skip
#           the step: the contract is not enforced, so the child fails); 1
#           when connections remain after ss -K (a kernel without socket
#           destroy), with how many on stdout.
# Must not: touch listening sockets, UDP, or connections within the guest
#           (to or from its loopback: both ends are in the child, alive);
#           count TIME-WAIT entries, which hold no socket to destroy.
#
# shellcheck disable=SC2016 # the filter is ss's own syntax, not the shell's

if ! ss -V >/dev/null 2>&1; then
	echo "the guest has no ss (iproute2) to close its inherited connections with"
	exit 2
fi
filter='( ! dst 127.0.0.0/8 and ! src 127.0.0.0/8 and ! dst [::1] and ! src [::1] )'
# ss -K prints the sockets it closed and skips silently those the kernel
# cannot close: what is left afterwards tells which.
closed=$(ss -K -Htn state connected exclude time-wait "$filter" 2>/dev/null | wc -l)
left=$(ss -Htn state connected exclude time-wait "$filter" 2>/dev/null | wc -l)
if [ "$left" -gt 0 ]; then
	echo "$left inherited TCP connections remain: the guest's kernel cannot destroy sockets (CONFIG_INET_DIAG_DESTROY)"
	exit 1
fi
echo "$closed closed"
