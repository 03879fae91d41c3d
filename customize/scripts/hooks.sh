# hooks.sh: the hooks step's part (hooks.go, HooksStep): runs the guest's
# post-fork hooks, the executable files in a directory whose names run-parts
# would run (letters, digits, "_" and "-"), in byte order (the batch runs
# with LC_ALL=C, so globs sort so).
#
# Runs:     a part of the identity batch (batch-head.sh), in a subshell.
# Inputs:   $1 the directory (PostForkDir); $2... NAME=VALUE pairs exported
#           to the hooks (hookEnv: VMFORK_NAME, VMFORK_INDEX, ...).
#           $VMFORK_STATUS from the batch.
# Outputs:  stdout: "ran NAME, NAME" and exit 0; "no hooks in DIR" and exit
#           100 when none ran. When a hook fails, its stderr, then on stdout
#           "NAME CODE RAN" (RAN: the hooks that ran before it) and exit 102
#           (hookFailure in hooks.go reads them). A hook's stdout is dropped;
#           its stderr goes to $VMFORK_STATUS.hook-err.
# Must not: run a hook after one failed; run a file whose name run-parts
#           would skip (editor backups, dpkg leftovers); give a hook a
#           stdin (it gets /dev/null).
#
# shellcheck disable=SC2163 # each argument is NAME=VALUE: export "$kv" exports it

dir=$1
shift
for kv in "$@"; do export "$kv"; done
e=$VMFORK_STATUS.hook-err
ran=
for f in "$dir"/*; do
	name=${f##*/}
	case $name in '' | *[!A-Za-z0-9_-]*) continue ;; esac
	if [ ! -f "$f" ] || [ ! -x "$f" ]; then continue; fi
	"$f" </dev/null >/dev/null 2>"$e"
	rc=$?
	if [ "$rc" -ne 0 ]; then
		while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l" >&2; done <"$e"
		printf '%s %s %s\n' "$name" "$rc" "$ran"
		exit 102
	fi
	ran="$ran${ran:+, }$name"
done
if [ -z "$ran" ]; then echo "no hooks in $dir"; exit 100; fi
printf 'ran %s\n' "$ran"
