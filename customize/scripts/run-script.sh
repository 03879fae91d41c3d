# run-script.sh: runs a spec's extra script (hooks.go, ScriptStep), which
# the host copied into the guest under a name no other guest user can
# guess, and removes it.
#
# Runs:     alone, with /bin/sh -c, in the child.
# Inputs:   $1 the copied script (it has a #! line); $2... its arguments.
#           The environment of post-fork hooks (hookEnv).
# Outputs:  the script's stdout and stderr (the host keeps stderr's tail);
#           its exit code, or chmod's when it could not be made executable.
# Must not: leave the copy behind, whatever the script exits with.

f=$1
shift
chmod 700 "$f" && "$f" "$@"
rc=$?
rm -f "$f"
exit $rc
