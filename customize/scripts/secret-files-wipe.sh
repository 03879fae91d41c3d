# secret-files-wipe.sh: the secret-files wipe step's part (secretfiles.go,
# SecretFilesWipeStep): deletes, in a fork child, the files its contract
# lists under secret_files.wipe, before its NIC comes up, so that the
# child does not go on with its parent's secrets (a session, a cache of
# credentials).
#
# Runs:     a part of the identity batch (batch-head.sh), in a subshell,
#           while the child's link is down. $R is the root of the guest's
#           files ("" in a guest).
# Inputs:   $1...: the files' absolute paths (clean, no .., checked by
#           package contract); not secret, so arguments.
# Outputs:  stdout: one line, "N wiped, M absent", and the absent files'
#           paths. Exit 0 (a file already absent is fine: there is nothing
#           to keep from the child); 101 with the reason as stderr's last
#           line when a path is a directory; 1 when rm fails.
# Must not: delete anything but the listed paths: a directory is refused,
#           not emptied, and a symbolic link is deleted, not its target;
#           touch the parent (this runs in the child only).
#
# shellcheck disable=SC1007 # "a= b=" sets each to empty, on purpose

n=0 a=0 absent=
for f in "$@"; do
	p=$R$f
	if [ -d "$p" ] && [ ! -L "$p" ]; then
		echo "$f is a directory: secret_files.wipe deletes files" >&2
		exit 101
	fi
	if [ -e "$p" ] || [ -L "$p" ]; then
		rm -f "$p" || exit 1
		n=$((n + 1))
	else
		a=$((a + 1)) absent="$absent, $f"
	fi
done
if [ "$a" -gt 0 ]; then
	echo "$n wiped, $a absent (${absent#, })"
else
	echo "$n wiped, 0 absent"
fi
