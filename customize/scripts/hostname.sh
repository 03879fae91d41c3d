# hostname.sh: the hostname step's part (steps.go, HostnameStep): sets the
# hostname and prints the mechanism. Every process it starts costs tens of
# milliseconds in a fork child under TCG, so it starts none where a shell
# builtin does: the kernel's hostname is read and written through /proc
# (what hostname(1) does with sethostname(2)), and /etc/hosts is rewritten
# by replace_host (replace-host.sh, which the host puts before this), and
# only when it names the old hostname. hostnamectl talks to
# systemd-hostnamed over D-Bus and fails without a bus ("Failed to connect
# to bus"), so it is tried only when the system bus's socket is there, and
# its failure falls back to the files.
#
# Runs:     a part of the identity batch (batch-head.sh), inline: a
#           function body run in the batch's own shell (see batch.go), so it
#           returns (never exits), sets no shell option, trap, umask,
#           directory or exported variable, and declares its variables
#           local (TestInlinePartsLeaveTheShellAlone checks).
#           Every command that may fail returns its status. $R is the root
#           of the guest's files ("" in a guest).
# Inputs:   $1 the new hostname (checked by the host: RFC 1123).
# Outputs:  stdout: one line, the mechanism (hostnamectl, or the files; and
#           /etc/hosts when it changed it). Returns 0; 101 with the reason
#           on stderr when the kernel took a shortened name and the guest
#           has no hostname command; else the failed command's status.
# Must not: replace a file (it rewrites /etc/hostname and /etc/hosts in
#           place: qemu-ga runs commands with umask 077, and a new
#           /etc/hosts would be unreadable to everyone but root); create
#           /etc/hostname where the guest has none; touch /etc/hosts lines
#           that do not name the old hostname.
#
# shellcheck disable=SC1007 # "a= b=" sets each to empty, on purpose
# shellcheck disable=SC2086 # $R (empty, or a test's directory) and the host names hold no blanks
# shellcheck disable=SC3043 # local: busybox ash, dash and bash all have it

local new=$1 old= cur= how= err= uts=$R/proc/sys/kernel/hostname
if [ -r "$uts" ]; then read -r old <"$uts" || :; else old=$(hostname 2>/dev/null || true); fi
if [ -d $R/run/systemd/system ] && [ -S $R/run/dbus/system_bus_socket ] && command -v hostnamectl >/dev/null 2>&1; then
	if err=$(hostnamectl set-hostname "$new" 2>&1); then
		how=hostnamectl
	else
		how="hostnamectl failed (${err%%
*}), so $R/etc/hostname and the kernel's name"
	fi
fi
if [ "$how" != hostnamectl ]; then
	{ printf '%s' "$new" >"$uts" && read -r cur <"$uts"; } 2>/dev/null || true
	# The kernel cuts a long name short where sethostname fails: let
	# hostname(1) set it, or say why it cannot.
	if [ "$cur" != "$new" ]; then
		if ! command -v hostname >/dev/null 2>&1; then
			echo "cannot set the kernel's hostname: $R/proc/sys/kernel/hostname did not take it and the guest has no hostname command (install hostname, or --skip-step vmfork.hostname)" >&2
			return 101
		fi
		hostname "$new" || return
	fi
	if [ -e $R/etc/hostname ]; then printf '%s\n' "$new" >$R/etc/hostname || return; fi
	if [ -z "$how" ]; then how="$R/etc/hostname and the kernel's name"; fi
fi
if [ -n "$old" ] && [ "$old" != "$new" ] && [ -f $R/etc/hosts ]; then
	replace_host $R/etc/hosts "$old" "$new" || return
	how="$how, $R/etc/hosts"
fi
printf '%s\n' "$how"
