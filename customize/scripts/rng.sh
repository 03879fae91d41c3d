# rng.sh: the rng step's part (steps.go, RNGStep): confirms that the guest
# kernel reseeded its CRNG from the child's new vmgenid (Linux 5.18+ logs
# "crng reseeded due to virtual machine fork"). A grandchild also sees its
# parent's log line, which is fine: its kernel has the driver and its GUID
# changed. dmesg is its one process: no shell builtin reads the kernel log.
#
# Runs:     a part of the identity batch (batch-head.sh), inline: a
#           function body run in the batch's own shell (see batch.go), so it
#           returns (never exits), sets no shell option, trap, umask,
#           directory or exported variable, and declares its variables
#           local (TestInlinePartsLeaveTheShellAlone checks).
#           $R is the root of the guest's files ("" in a guest).
# Inputs:   none; the kernel log, /sys/bus/acpi/drivers/vmgenid.
# Outputs:  stdout: "reseeded", or "uninitialized" (the CRNG was not yet
#           seeded at the fork; it will be seeded from the input pool, which
#           the new GUID went into); returns 0. Returns 101 with the reason
#           on stderr when the kernel has no vmgenid driver or its log shows
#           no reseed after 30 tries 0.1 s apart (3 s); 1 when dmesg fails.
# Must not: change anything: it only reads.
#
# shellcheck disable=SC2086 # $R: empty, or a test's directory
# shellcheck disable=SC3043 # local: busybox ash, dash and bash all have it

local i=0 log=
set -- $R/sys/bus/acpi/drivers/vmgenid/*:*
if [ ! -e "$1" ]; then
	echo "the guest kernel has no vmgenid driver (CONFIG_VMGENID): the child would keep its siblings' random state; boot a kernel with CONFIG_VMGENID=y (Debian's generic one has it), or --skip-step vmfork.rng" >&2
	return 101
fi
while :; do
	if ! log=$(dmesg 2>&1); then
		echo "cannot read the kernel log to confirm the CRNG reseed: $log" >&2
		return 1
	fi
	case $log in
	*"crng reseeded due to virtual machine fork"*) echo reseeded; return 0 ;;
	*"crng init done"*) ;;
	*) echo uninitialized; return 0 ;;
	esac
	i=$((i + 1))
	if [ "$i" -ge 30 ]; then
		echo "the kernel log shows no CRNG reseed after the vmgenid change" >&2
		return 101
	fi
	sleep 0.1
done
