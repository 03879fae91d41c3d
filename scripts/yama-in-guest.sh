#!/bin/sh
# Runs qemudrv's Yama tests (TestPtracerShimUnderYama: under ptrace_scope 1 a
# non-ancestor of the same user may trace a process started through vmfork's
# ptracer shim, and not one started without it) inside the Debian test guest,
# whose kernel has Yama, for hosts whose own kernel has none. Boots one Debian
# guest in a throwaway state dir and removes it, pass or fail.
#
# Usage (as root, from the repository, after make build guest-debian):
#   flock -o /tmp/vmfork-tcg.lock scripts/yama-in-guest.sh
set -eu
bin=${VMFORK_BIN:-$(pwd)/bin/vmfork}
deb=${VMFORK_DEBIAN_GUEST:-/var/cache/vmfork/debian-guest/current}
append=$(grep '^ifupdown-nodbus' "$deb/variants" | cut -f2)
work=$(mktemp -d)
mem=$(mktemp -d -p /dev/shm)
vm() { "$bin" --state-dir "$work/state" --mem-dir "$mem" --timeout 5m "$@"; }
cleanup() { vm rm yama --force >/dev/null 2>&1 || true; rm -rf "$work" "$mem"; }
trap cleanup EXIT INT TERM
CGO_ENABLED=0 go test -c -o "$work/qemudrv.test" ./qemudrv
vm boot yama --kernel "$deb/vmlinuz" --initrd "$deb/initrd.img" --disk "$deb/root.qcow2" \
	--append "$append" --memory 512M >/dev/null
vm cp "$work/qemudrv.test" yama:/root/qemudrv.test
vm exec yama -- sh -c 'chmod 755 /root/qemudrv.test && /root/qemudrv.test -test.run Ptracer -test.v'
