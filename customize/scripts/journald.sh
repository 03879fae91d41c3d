# journald.sh: the machine-id step's second part (steps.go, MachineIDStep):
# restarts systemd-journald, which reads the machine-id when it starts and
# otherwise goes on writing to the journal of the old id. It is the chain's
# last part (Part.Last): in a fresh Debian child under TCG, journald's
# restart beside the DHCP client made that 1 s slower.
#
# Runs:     a part of the identity batch (batch-head.sh), inline, at the end
#           of the chain's last batch: a function body run in the batch's
#           own shell (see batch.go), so it returns (never exits), sets no
#           shell option, trap, umask, directory or exported variable, and
#           declares its variables local (TestInlinePartsLeaveTheShellAlone
#           checks).
#           $R is the root of the guest's files ("" in a guest).
# Inputs:   none.
# Outputs:  stdout: "systemd-journald restarting" when it asked for the
#           restart, else nothing; returns 0.
# Must not: wait for journald (systemctl reaches PID 1 over its private
#           socket, so it works without D-Bus; --no-block and the background
#           keep the restart out of the chain: PID 1 of a fresh child under
#           TCG can take seconds to take the job, and nothing in the chain
#           needs journald); fail the step.
#
# shellcheck disable=SC2086 # $R: empty, or a test's directory

if [ -d $R/run/systemd/system ] && [ -e $R/run/systemd/journal/socket ]; then
	systemctl --no-block restart systemd-journald.service >/dev/null 2>&1 </dev/null &
	echo "systemd-journald restarting"
fi
return 0
