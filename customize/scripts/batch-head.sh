# batch-head.sh: the start of every identity batch (batch.go, buildBatch):
# the guest command in which Run runs the steps' parts, one after the other.
# buildBatch appends one function per part (vmfork_part_N, a part's script
# as its body), VMFORK_STATUS=$1, and a vmfork_run line per part.
#
# Runs:     as /bin/sh -c in the guest (qemu-ga's guest-exec), stdin
#           replaced by /dev/null; PATH and LC_ALL=C set by the host.
# Inputs:   environment: VMFORK_ROOT, the root of the guest's files in the
#           parts' paths (unset in a guest; a directory in the tests that
#           run the scripts on the host); VMFORK_INPUT, the one part's input
#           (Part.Input), moved into $vmfork_input and unset before any part
#           runs, so that no process the batch starts inherits it.
#           vmfork_run N SUB ARGS...: part N, in a subshell (SUB 1) or in
#           this shell (SUB 0, an inline part), with ARGS as its $1, $2, ...
# Outputs:  per part, on stdout and on stderr, a line "\036vmfork part N"
#           (\036: ASCII record separator, batchMark in batch.go) before its
#           output; on stdout "\036vmfork end N CODE NS" after it: its exit
#           code and nanoseconds taken. vmfork_run returns 0 for exit 0 and
#           100 (nothing to do, exitNothingToDo), else 1, which ends the batch.
#           $VMFORK_STATUS holds the number of the running part, so that the
#           host can tell which timed out.
# Must not: start a process (it reads the clock from /proc/timer_list's
#           "now at N nsecs", root only, else /proc/uptime in hundredths,
#           with shell builtins); print anything but the frames; leave
#           VMFORK_INPUT in the environment; write anything but
#           $VMFORK_STATUS.
#
# TestGuestScriptsAgreeWithGo (guestscripts_test.go) checks that the frames,
# the input variable and the exit code agree with batch.go's constants.
#
# shellcheck disable=SC2034 # R and vmfork_input are for the parts that follow

# vmfork identity batch
exec </dev/null
R=${VMFORK_ROOT-}
vmfork_input=${VMFORK_INPUT-}
unset VMFORK_INPUT
vmfork_now() {
	vmfork_ns=
	{ read -r _ && read -r _ && read -r _ _ vmfork_ns _; } </proc/timer_list 2>/dev/null
	case $vmfork_ns in
	'' | *[!0-9]*)
		read -r vmfork_up _ </proc/uptime
		vmfork_ns=${vmfork_up%.*}${vmfork_up#*.}0000000
		;;
	esac
}
vmfork_run() {
	vmfork_n=$1 vmfork_sub=$2
	shift 2
	printf '%s\n' "$vmfork_n" >"$VMFORK_STATUS" 2>/dev/null
	printf '\036vmfork part %s\n' "$vmfork_n"
	printf '\036vmfork part %s\n' "$vmfork_n" >&2
	vmfork_now
	vmfork_t0=$vmfork_ns
	if [ "$vmfork_sub" = 0 ]; then
		"vmfork_part_$vmfork_n" "$@"
	else
		("vmfork_part_$vmfork_n" "$@")
	fi
	vmfork_rc=$?
	vmfork_now
	printf '\n\036vmfork end %s %s %s\n' "$vmfork_n" "$vmfork_rc" "$((vmfork_ns - vmfork_t0))"
	case $vmfork_rc in 0 | 100) return 0 ;; esac
	return 1
}
