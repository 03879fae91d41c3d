#!/usr/bin/env bash
# Forks 1..N of one source with every child kept (docs/FLATPAUSE.md, "Delta
# templates"; issue 27), for each vmfork binary given (this build, and an
# older one that copies the frozen file before each later fork). The source
# (MEM, default 1G) holds USE MiB (default 512) of non-zero data in a guest
# tmpfs and writes WRITE MiB (default 8) of new data between forks. One line
# per fork: binary, fork number, the fork's whole call (wall clock around
# `vmfork fork`), its pause_ms and the child's ready_ms (--json), the RAM
# mode and the bytes copied before and in the pause (the driver's debug
# log), the time to apply a delta in the child, and the mem dir's allocated
# bytes after the fork (du, each file once however many names it has). Uses
# its own state and mem dirs, removed after.
#
#   scripts/delta-forks.sh bin/vmfork /tmp/old/vmfork
set -euo pipefail
G=${VMFORK_GUEST:-/var/cache/vmfork/guest}
N=${N:-5} MEM=${MEM:-1G} USE=${USE:-512} WRITE=${WRITE:-8}
err=$(mktemp)
trap 'rm -f "$err"' EXIT
for bin in "$@"; do
  tag=$bin
  st=$(mktemp -d /tmp/delta-st.XXXXXX)
  mem=$(mktemp -d /dev/shm/delta-mem.XXXXXX)
  V=("$bin" --state-dir "$st" --mem-dir "$mem")
  src=delta-$RANDOM
  "${V[@]}" boot "$src" --kernel "$G/vmlinuz" --initrd "$G/initrd.gz" --disk "$G/data.qcow2" --memory "$MEM" >/dev/null 2>&1
  "${V[@]}" exec "$src" -- vmfork-counter start >/dev/null
  # 1 MiB of urandom, catenated: urandom for the whole size is minutes under TCG.
  "${V[@]}" exec "$src" -- sh -c "mkdir -p /fill && mount -t tmpfs -o size=$((USE + N * WRITE + 8))m fill /fill &&
    head -c 1048576 /dev/urandom >/fill/seed && i=0 &&
    while [ \$i -lt $USE ]; do cat /fill/seed; i=\$((i + 1)); done >/fill/data" >&2
  for f in $(seq "$N"); do
    if [ "$f" -gt 1 ]; then
      "${V[@]}" exec "$src" -- sh -c "head -c 1048576 /dev/urandom >/fill/seed && i=0 &&
        while [ \$i -lt $WRITE ]; do cat /fill/seed; i=\$((i + 1)); done >/fill/w$f" >&2
    fi
    t0=$(date +%s%N)
    if ! out=$("${V[@]}" --log-level debug fork "$src" "$src-c$f" --json 2>"$err"); then
      tail -3 "$err" >&2
      exit 1
    fi
    t1=$(date +%s%N)
    read -r pause ready < <(printf '%s' "$out" | python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["pause_ms"], r["children"][0].get("ready_ms", 0))')
    log=$(grep 'msg=frozen\|msg="delta applied"' "$err" | grep -o 'ram_mode=[a-z]*\|tracked=[a-z]*\|precopied_bytes=[0-9]*\|paused_copy_bytes=[0-9]*\|delta_ms=[0-9.]*' | tr '\n' ' ' || true)
    held=$(du -s -B1 "$mem" | cut -f1)
    echo "$tag fork=$f whole_ms=$(( (t1 - t0) / 1000000 )) pause_ms=$pause ready_ms=$ready memdir_MiB=$((held >> 20)) $log"
  done
  for f in $(seq "$N"); do "${V[@]}" rm "$src-c$f" >/dev/null 2>&1; done
  "${V[@]}" rm "$src" >/dev/null 2>&1
  rm -rf "$st" "$mem"
done
