# secret-files-rotate.sh: the secret-files rotate step's part
# (secretfiles.go, SecretFilesRotateStep): writes, in a fork child, its own
# value into each file its contract lists under secret_files.rotate (a host
# command's output for that child), before its NIC comes up.
#
# Each file is replaced atomically: the value goes into a temporary file in
# the same directory (mktemp: created 0600, exclusively), which gets the
# old file's owner and mode 0600, then is renamed over the file (mv within
# a directory is rename(2)). A reader sees the old file or the new one,
# never half of either; a step cut short leaves at most the temporary
# file, which it removes when it can. A symbolic link whose target exists
# is followed: the target is replaced (a link keeps pointing at the new
# value, and the parent's value is gone from the child); a dangling one is
# replaced by the file. A file the child lacks is created 0600, root's,
# with its missing directories (0755).
#
# Runs:     a part of the identity batch (batch-head.sh), in a subshell,
#           as root, while the child's link is down. $R is the root of the
#           guest's files ("" in a guest).
# Inputs:   $vmfork_input (Part.Input, from the batch's environment: never
#           a command line, which any guest user can read): the files, each
#           as a line "%vmfork% F PATH", its new bytes, then a line
#           "%vmfork% E" (keyMark in sshkeys.go, as secrets.sh and
#           ssh-keys.sh take theirs). No value is ever an argument.
# Outputs:  stdout: one line, "N rotated (mode 0600, owner kept)" and, for
#           files that were absent, "M created 0600 root-owned: PATHS".
#           Exit 0; 101 with the reason as stderr's last line when a path
#           is a directory; 1 when the input is cut short or a file cannot
#           be written, owned or renamed.
# Must not: print or log a value, or pass one to a command as an argument
#           (printf is the shell's builtin); leave a file readable by
#           anyone but its owner; change the owner of a file it replaces;
#           write anything but the listed files and their temporary files.
#
# shellcheck disable=SC1007 # "a= b=" sets each to empty, on purpose
# shellcheck disable=SC2154 # vmfork_input is set by batch-head.sh

umask 077
m='%vmfork%' nl='
' f= c= p= own= tmp= n=0 made=0 created=
rest=$vmfork_input
while [ -n "$rest" ]; do
	case $rest in
	"$m F "*"$nl"*"$m E$nl"*) ;;
	*)
		echo "the rotated files' input is cut short after $n files" >&2
		exit 1
		;;
	esac
	f=${rest%%"$nl"*} rest=${rest#*"$nl"}
	f=${f#"$m F "}
	c=${rest%%"$m E$nl"*} rest=${rest#*"$m E$nl"}
	p=$R$f
	if [ -L "$p" ] && [ -e "$p" ]; then
		p=$(readlink -f "$p") || exit 1
	fi
	if [ -d "$p" ]; then
		echo "$f is a directory: secret_files.rotate writes files" >&2
		exit 101
	fi
	own=
	if [ -e "$p" ]; then
		own=$(stat -c %u:%g "$p") || exit 1
	elif [ ! -d "${p%/*}" ]; then
		(umask 022 && mkdir -p "${p%/*}") || exit 1
	fi
	tmp=$(mktemp "${p%/*}/.vmfork-rotate.XXXXXX") || exit 1
	if ! { printf '%s' "$c" >"$tmp" && chmod 600 "$tmp" &&
		{ [ -z "$own" ] || chown "$own" "$tmp"; } && mv -f "$tmp" "$p"; }; then
		rm -f "$tmp"
		echo "$f: could not be replaced" >&2
		exit 1
	fi
	if [ -n "$own" ]; then
		n=$((n + 1))
	else
		made=$((made + 1)) created="$created, $f"
	fi
done
if [ "$made" -gt 0 ]; then
	echo "$n rotated (mode 0600, owner kept); $made created 0600 root-owned: ${created#, }"
else
	echo "$n rotated (mode 0600, owner kept)"
fi
