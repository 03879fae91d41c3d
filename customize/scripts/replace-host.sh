# replace-host.sh: defines replace_host FILE OLD NEW, which hostname.sh
# (steps.go, HostnameStep) runs on /etc/hosts. It replaces OLD by NEW
# wherever it is a host name in FILE (a field after the first), like
#
#	awk -v old="$old" -v new="$new" '{ for (i = 2; i <= NF; i++) if ($i == old) $i = new; print }'
#
# with shell builtins only: lines it changes have their fields joined by
# single spaces, other lines stay as they are. A file of more than 500
# lines, too slow for a shell loop, goes through that awk program instead.
#
# Runs:     the host puts it before hostname.sh, in the same inline part:
#           the function runs in the batch's own shell, so it returns the
#           status of what failed and its variables are local.
# Inputs:   FILE, OLD and NEW as its arguments.
# Outputs:  none on stdout; returns 0, or the status of the write that
#           failed.
# Must not: write FILE unless a line changed; replace FILE (it rewrites it
#           in place, keeping its mode and owner: qemu-ga runs commands with
#           umask 077); leave FILE.vmfork, the awk path's copy, behind.
#
# shellcheck disable=SC1007 # "a= b=" sets each to empty, on purpose
# shellcheck disable=SC2086 # local's values, a path and two host names, hold no blanks
# shellcheck disable=SC2094 # FILE is read whole before it is written
# shellcheck disable=SC3043 # local: busybox ash, dash and bash all have it

replace_host() {
	local _f=$1 _old=$2 _new=$3 _out= _hit= _n=0 _l= _r= _m= _w= _rc=0
	while IFS= read -r _l || [ -n "$_l" ]; do
		_n=$((_n + 1))
		if [ "$_n" -gt 500 ]; then
			awk -v old="$_old" -v new="$_new" '{ for (i = 2; i <= NF; i++) if ($i == old) $i = new; print }' "$_f" >"$_f.vmfork" &&
				cat "$_f.vmfork" >"$_f" || _rc=$?
			rm -f "$_f.vmfork"
			return "$_rc"
		fi
		set -f
		# shellcheck disable=SC2086 # split into fields, as awk does
		set -- $_l
		set +f
		if [ $# -ge 2 ]; then
			_r=$1 _m=
			shift
			for _w in "$@"; do
				if [ "$_w" = "$_old" ]; then _w=$_new _m=1; fi
				_r="$_r $_w"
			done
			if [ -n "$_m" ]; then _l=$_r _hit=1; fi
		fi
		_out="$_out$_l
"
	done <"$_f"
	if [ -n "$_hit" ]; then printf '%s' "$_out" >"$_f"; fi
}
