#!/bin/bash
# Reproduces the QEMU 7.2 segfault of a loaded machine (a fork child) whose
# guest powers itself off or reboots, and the write it loses
# (docs/RELIABILITY.md, "A stop keeps what the guest wrote").
#
#   scripts/repro-incoming-segv.sh [poweroff|reboot] [VMFORK_BINARY]
#
# Boots the busybox test guest with a data disk, forks a child, has the
# child write 8 bytes to the data disk (dd + sync: in QEMU's qcow2 cache,
# not yet flushed to the image) and then, inside the guest:
#   poweroff: `poweroff -f` (the guest's own power-off, no vmfork stop);
#             then `vmfork start` and read the 8 bytes back.
#   reboot:   `reboot -f`; the child's agent must answer again.
# Prints SEGFAULT with the kernel's line when the child's QEMU crashed, and
# exits 1 when it crashed or the write was lost. Runs in a temporary state
# and mem dir, removed at the end. Needs root (dmesg) and the guest images
# in /var/cache/vmfork/guest. VMFORK_CONNECT=qemu:///system runs it on the
# libvirt driver (after `vmfork libvirt setup` with the same binary).
#
# The crash: with -global migration.announce-rounds=0 virtio-net's
# post_load frees its announce timer, and the next virtio-net reset (the
# guest's driver at power-off, a reboot's system reset) calls
# timer_del(NULL). To see it again, start children with announce-rounds=0
# (qemudrv.announceRounds) and run this script.
set -euo pipefail
mode=${1:-poweroff}
bin=${2:-$(dirname "$0")/../bin/vmfork}
guest=${VMFORK_GUEST:-/var/cache/vmfork/guest}
case $mode in poweroff | reboot) ;; *)
	echo "usage: $0 [poweroff|reboot] [VMFORK_BINARY]" >&2
	exit 2
	;;
esac
dir=$(mktemp -d /tmp/vmfork-segv.XXXXXX)
mem=$(mktemp -d /dev/shm/vmfork-segv.XXXXXX)
connect=()
if [ -n "${VMFORK_CONNECT:-}" ]; then connect=(--connect "$VMFORK_CONNECT"); fi
v() { "$bin" "${connect[@]}" --state-dir "$dir/state" --mem-dir "$mem" "$@"; }
cleanup() {
	v rm -f src kid >/dev/null 2>&1 || true
	rm -rf "$dir" "$mem"
}
trap cleanup EXIT
qemu-img create -q -f qcow2 "$dir/data.qcow2" 1M
v boot src --kernel "$guest/vmlinuz" --initrd "$guest/initrd.gz" --disk "$guest/data.qcow2" \
	--memory 256M --disk "id=data,file=$dir/data.qcow2" >/dev/null
v exec src -- sh -c 'printf PARENT01 | dd of=/dev/vdb bs=8 count=1 conv=notrunc 2>/dev/null && sync'
v fork src kid >/dev/null
pid=$(v ls --json | jq -r '.[] | select(.name=="kid") | .pid')
v exec kid -- sh -c 'printf CHILD-01 | dd of=/dev/vdb bs=8 count=1 conv=notrunc 2>/dev/null && sync'
# The kernel names a crashing thread by its own id: note QEMU's threads.
tids=$(ls /proc/"$pid"/task | paste -sd'|')
# In the background, so exec returns before the guest goes.
v exec kid -- sh -c "(sleep 0.3; $mode -f) >/dev/null 2>&1 &"
fail=0
segv() { dmesg | grep -E "\[($tids)\]: segfault" || true; }
if [ "$mode" = poweroff ]; then
	for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$pid" 2>/dev/null; then
		echo "QEMU (pid $pid) still runs 30 s after the guest's poweroff -f" >&2
		exit 1
	fi
	if [ -n "$(segv)" ]; then echo "SEGFAULT: $(segv)"; fail=1; else echo "QEMU (pid $pid) exited without a crash"; fi
	v start kid >/dev/null
	got=$(v exec kid -- sh -c 'echo 3 >/proc/sys/vm/drop_caches; dd if=/dev/vdb bs=8 count=1 2>/dev/null')
	if [ "$got" = CHILD-01 ]; then echo "the child's write survived: $got"; else echo "WRITE LOST: the disk reads $got, want CHILD-01"; fail=1; fi
else
	sleep 3
	ok=0
	for _ in $(seq 60); do
		if ! kill -0 "$pid" 2>/dev/null; then break; fi
		if v exec kid -- true >/dev/null 2>&1; then ok=1; break; fi
		sleep 1
	done
	if [ -n "$(segv)" ]; then echo "SEGFAULT: $(segv)"; fail=1; fi
	if [ $ok = 1 ]; then echo "the child rebooted; its agent answers (QEMU pid $pid)"; else echo "the child did not come back from reboot -f"; fail=1; fi
fi
exit $fail
