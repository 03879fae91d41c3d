# ssh-keys.sh: the ssh-host-keys step's part (sshkeys.go, SSHHostKeysStep):
# writes the new SSH host keys the host made, then has a running sshd load
# them. A running sshd is told as systemctl reload ssh would (Debian's
# ExecReload: a config test, then SIGHUP to the main pid): SIGHUP makes sshd
# re-execute itself and read the new keys, keeping open sessions. Without
# its pid file, systemctl asks the service manager (ssh on Debian, sshd on
# RHEL-family guests). A socket-activated sshd starts per connection and
# reads the new keys anyway.
#
# Runs:     a part of the identity batch (batch-head.sh), in a subshell.
#           $R is the root of the guest's files ("" in a guest).
# Inputs:   $vmfork_input (Part.Input, from the batch's environment): the
#           files, each as a line "%vmfork% F PATH", its bytes, then a line
#           "%vmfork% E" (%vmfork% is keyMark in sshkeys.go). They are cut
#           out of it with parameter expansions: no read, no process.
# Outputs:  stdout: one line, how sshd was told ("sshd reloaded (SIGHUP to
#           pid N)", "systemctl try-reload-or-restart ssh.service" or "no
#           running sshd"). Exit 0; 1 when the input is cut short, a file
#           cannot be written or sshd cannot be told.
# Must not: write any file but those its input names; replace a key file
#           (it writes in place, so each keeps its mode and owner: 0600 for
#           private keys, 0644 for public ones, as ssh-keygen made them; a
#           missing one is made 0600 under umask 077); restart an sshd that
#           a reload serves (open sessions stay).
#
# shellcheck disable=SC1007 # "a= b=" sets each to empty, on purpose
# shellcheck disable=SC2086 # $R: empty, or a test's directory
# shellcheck disable=SC2154 # vmfork_input is set by batch-head.sh

umask 077
m='%vmfork%' nl='
' f= c= n=0
rest=$vmfork_input
while [ -n "$rest" ]; do
	case $rest in
	"$m F "*"$nl"*"$m E$nl"*) ;;
	*)
		echo "the SSH keys' input is cut short after $n files" >&2
		exit 1
		;;
	esac
	f=${rest%%"$nl"*} rest=${rest#*"$nl"}
	f=${f#"$m F "}
	c=${rest%%"$m E$nl"*} rest=${rest#*"$m E$nl"}
	printf '%s' "$c" >"$R$f" || exit 1
	n=$((n + 1))
done
pid= comm=
if [ -r $R/run/sshd.pid ] && read -r pid <$R/run/sshd.pid && [ -n "$pid" ] && read -r comm <"$R/proc/$pid/comm" 2>/dev/null && [ "$comm" = sshd ]; then
	kill -HUP "$pid" || exit 1
	echo "sshd reloaded (SIGHUP to pid $pid)"
elif [ -d $R/run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	for u in ssh sshd; do
		for d in $R/etc/systemd/system $R/run/systemd/system $R/lib/systemd/system $R/usr/lib/systemd/system; do
			if [ -e "$d/$u.service" ]; then
				systemctl try-reload-or-restart "$u.service" </dev/null >/dev/null || exit 1
				echo "systemctl try-reload-or-restart $u.service"
				exit 0
			fi
		done
	done
	echo "no running sshd"
else
	echo "no running sshd"
fi
