# hooks-list.sh: lists the pre-fork hooks (hooks.go, runHooks), which the
# host then runs one guest command each.
#
# Runs:     alone, with /bin/sh -c (guest.go, shell), in the source before
#           its freeze.
# Inputs:   $1 the directory (PreForkDir). PATH and LC_ALL=C.
# Outputs:  stdout: the name of each executable file in $1, one a line;
#           nothing when $1 is missing. Exit 0.
# Must not: run or change anything: it only lists.

[ -d "$1" ] || exit 0
for f in "$1"/*; do
	if [ -f "$f" ] && [ -x "$f" ]; then printf '%s\n' "${f##*/}"; fi
done
