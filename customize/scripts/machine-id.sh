# machine-id.sh: the machine-id step's first part (steps.go, MachineIDStep):
# writes the new machine-id, and the D-Bus copy where it is a file of its
# own, not the usual link.
#
# Runs:     a part of the identity batch (batch-head.sh), inline: a
#           function body run in the batch's own shell (see batch.go), so it
#           returns (never exits), sets no shell option, trap, umask,
#           directory or exported variable, and declares its variables
#           local (TestInlinePartsLeaveTheShellAlone checks).
#           $R is the root of the guest's files ("" in a guest).
# Inputs:   $1 the new machine-id (32 hex digits, made on the host).
# Outputs:  stdout: one line, the files it wrote; returns 0. Returns 100
#           with the reason on stdout when the guest has no /etc/machine-id;
#           1 when it cannot be written.
# Must not: create /etc/machine-id where the guest has none; write through
#           /var/lib/dbus/machine-id when it is a link (to /etc/machine-id);
#           replace either file (it rewrites them in place).
#
# shellcheck disable=SC2086 # $R: empty, or a test's directory
# shellcheck disable=SC3043 # local: busybox ash, dash and bash all have it

if [ ! -e $R/etc/machine-id ]; then echo "the guest has no $R/etc/machine-id"; return 100; fi
printf '%s\n' "$1" >$R/etc/machine-id || return 1
local how=$R/etc/machine-id
if [ -f $R/var/lib/dbus/machine-id ] && [ ! -L $R/var/lib/dbus/machine-id ]; then
	printf '%s\n' "$1" >$R/var/lib/dbus/machine-id && how="$how, $R/var/lib/dbus/machine-id (a copy)"
fi
printf '%s\n' "$how"
