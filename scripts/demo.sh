#!/usr/bin/env bash
# The vmfork demo: boots the test guest, runs a command in it through the
# guest agent, lists it and removes it. Run it with `make demo`.
# It uses a state dir and mem dir of its own and removes them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${VMFORK_BIN:-bin/vmfork}
guest=${VMFORK_GUEST:-tests/guest/out}
export VMFORK_STATE_DIR=${VMFORK_STATE_DIR:-$(mktemp -d /tmp/vmfork-demo.XXXXXX)}
export VMFORK_MEM_DIR=${VMFORK_MEM_DIR:-$(mktemp -d /dev/shm/vmfork-demo.XXXXXX)}
cleanup() {
  "$bin" -q rm --force demo >/dev/null 2>&1 || true
  rm -rf "$VMFORK_STATE_DIR" "$VMFORK_MEM_DIR"
}
trap cleanup EXIT

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

step vmfork boot demo --kernel "$guest/vmlinuz" --initrd "$guest/initrd.gz" --disk "$guest/data.qcow2" --memory 256M
start=$(date +%s%N)
"$bin" boot demo --kernel "$guest/vmlinuz" --initrd "$guest/initrd.gz" --disk "$guest/data.qcow2" --memory 256M
ms=$(( ($(date +%s%N) - start) / 1000000 ))
printf '(booted to an answering guest agent in %d.%03d s)\n' $((ms / 1000)) $((ms % 1000))

step vmfork exec demo -- uname -r
"$bin" exec demo -- uname -r

step vmfork exec demo -- sh -c 'echo hello > /data/hello; cat /data/hello'
"$bin" exec demo -- sh -c 'echo hello > /data/hello; cat /data/hello'

step vmfork ls
"$bin" ls

step vmfork rm demo
"$bin" rm demo
