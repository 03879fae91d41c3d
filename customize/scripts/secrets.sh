# secrets.sh: the secrets step's part (contract.go, SecretsStep): writes
# the files of the child's brokered secrets (placeholders, the proxy's
# settings, vmfork's CA: package broker, GuestFiles) and adds the CA to the
# guest's trust store, so that TLS to the secrets' hosts through the
# host's broker verifies. No value is in any of them.
#
# Runs:     a part of the identity batch (batch-head.sh), in a subshell.
#           $R is the root of the guest's files ("" in a guest).
# Inputs:   $vmfork_input (Part.Input, from the batch's environment): the
#           files, each as a line "%vmfork% F PATH", its bytes, then a line
#           "%vmfork% E" (the SSH keys' framing, keyMark in sshkeys.go).
#           $1 is the CA file among them; $2... the trust stores, each
#           "ID FILE BUNDLE COMMAND..." with ID an os-release ID (matched
#           against the guest's ID, then its ID_LIKE).
# Trust:    the CA goes in FILE, where COMMAND finds it whenever it runs,
#           and is appended to BUNDLE, the file programs read, replaced
#           atomically. COMMAND itself runs only where the guest has no
#           BUNDLE yet: it rebuilds every certificate's links, a minute and
#           more per child under TCG. A FILE that already holds this CA
#           (a child of a child, of a kept template whose source had it)
#           is left as it is: its bundle has it too.
# Outputs:  stdout: one line, the files written and where the CA went.
#           Exit 0; 1 when the input is cut short, a file cannot be written
#           or the trust store's command fails. A guest whose family has no
#           known trust store, or that lacks the store's command (a Debian
#           without ca-certificates), keeps the CA in $1 only, and says so.
# Must not: write any file but those its input names and the trust store's
#           own; make a file that is not world-readable (none holds a
#           value).
#
# shellcheck disable=SC1007 # "a= b=" sets each to empty, on purpose
# shellcheck disable=SC2086 # $R: empty, or a test's directory; $cmd split on purpose
# shellcheck disable=SC2154 # vmfork_input is set by batch-head.sh
# shellcheck disable=SC1091 # os-release is the guest's, read where it runs

umask 022
m='%vmfork%' nl='
' f= c= n=0
rest=$vmfork_input
while [ -n "$rest" ]; do
	case $rest in
	"$m F "*"$nl"*"$m E$nl"*) ;;
	*)
		echo "the secrets' input is cut short after $n files" >&2
		exit 1
		;;
	esac
	f=${rest%%"$nl"*} rest=${rest#*"$nl"}
	f=${f#"$m F "}
	c=${rest%%"$m E$nl"*} rest=${rest#*"$m E$nl"}
	mkdir -p "$R${f%/*}" || exit 1
	printf '%s' "$c" >"$R$f" || exit 1
	n=$((n + 1))
done
ca=$1
shift
id= like=
if [ -r $R/etc/os-release ]; then
	id=$(. $R/etc/os-release && echo "$ID")
	like=$(. $R/etc/os-release && echo "$ID_LIKE")
fi
for want in $id $like; do
	for ts in "$@"; do
		tid=${ts%% *} rest=${ts#* }
		file=${rest%% *} rest=${rest#* }
		bundle=${rest%% *} cmd=${rest#* }
		[ "$tid" = "$want" ] || continue
		if [ -f "$R$file" ] && cmp -s "$R$ca" "$R$file"; then
			echo "$n files; the CA already in the $want trust store ($file)"
			exit 0
		fi
		if [ -z "$R" ] && ! command -v "${cmd%% *}" >/dev/null 2>&1; then
			echo "$n files; the guest has no ${cmd%% *} (its trust store is not installed): programs must trust $ca themselves"
			exit 0
		fi
		mkdir -p "$R${file%/*}" && cat "$R$ca" >"$R$file" || exit 1
		b=$(readlink -f "$R$bundle")
		if [ -n "$b" ] && [ -f "$b" ]; then
			t=$(mktemp "$b.XXXXXX") || exit 1
			if ! { cat "$b" && echo && cat "$R$ca"; } >"$t" || ! chmod 644 "$t" || ! mv -f "$t" "$b"; then
				rm -f "$t"
				exit 1
			fi
			echo "$n files; the CA added to the $want trust store ($file) and its bundle ($bundle)"
			exit 0
		fi
		if [ -z "$R" ]; then
			$cmd >/dev/null 2>&1 </dev/null || { echo "$cmd failed"; exit 1; }
		fi
		echo "$n files; the CA added to the $want trust store ($file, $cmd)"
		exit 0
	done
done
echo "$n files; no trust store known for this guest (ID=${id:-none}): programs must trust $ca themselves"
