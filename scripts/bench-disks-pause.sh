#!/bin/bash
# The pause of a live fork with 1, 2 and 4 disks (docs/BENCHMARKS.md, "The
# pause with several disks"): boots the busybox test guest with 0, 1 and 3
# extra 64 MiB qcow2 disks, forks it five times each and prints fork --json's
# pause_ms. Everything it makes lives in temporary state and mem dirs,
# removed at the end. VMFORK_BIN and VMFORK_GUEST as for the tests;
# CONNECT=qemu:///system measures the libvirt driver (machine names then
# carry a prefix of this process's, libvirt's domain names being host-wide).
set -u
B=${VMFORK_BIN:-bin/vmfork}
G=${VMFORK_GUEST:-/var/cache/vmfork/guest}
S=$(mktemp -d /var/tmp/disks-pause-XXXX)
M=$(mktemp -d /dev/shm/disks-pause-XXXX)
C=()
if [ -n "${CONNECT:-}" ]; then C=(--connect "$CONNECT"); fi
P=dp$$-
v() { "$B" --state-dir "$S" --mem-dir "$M" "${C[@]}" "$@"; }
cleanup() {
	for n in 0 1 3; do v rm -f "${P}m$n" -q 2>/dev/null; done
	for p in $(pgrep -f -- "--state-dir $S --log-level info ledger-server"); do kill "$p"; done
	rm -rf "$S" "$M"
}
trap cleanup EXIT
for n in ${NS:-0 1 3}; do
	args=()
	for i in $(seq 1 "$n"); do
		qemu-img create -q -f qcow2 "$S/d$n-$i.qcow2" 64M
		args+=(--disk "id=d$i,file=$S/d$n-$i.qcow2")
	done
	v boot "${P}m$n" --kernel "$G/vmlinuz" --initrd "$G/initrd.gz" --disk "$G/data.qcow2" "${args[@]}" --memory 256M -q >/dev/null || { echo "boot with $((n + 1)) disks failed"; continue; }
	for r in 1 2 3 4 5; do
		p=$(v fork "${P}m$n" "${P}c$n-$r" --json -q | python3 -c 'import json,sys; print(json.load(sys.stdin)["pause_ms"])')
		echo "disks=$((n + 1)) run=$r pause_ms=$p"
		v rm -f "${P}c$n-$r" -q
	done
	v rm -f "${P}m$n" -q
done
