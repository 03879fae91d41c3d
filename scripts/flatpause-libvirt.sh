#!/usr/bin/env bash
# Pause of a libvirt-driver fork (docs/FLATPAUSE.md): an idle
# 512 MiB source and a 2 GiB source holding 1.2 GiB of non-zero data (a tmpfs
# in the guest), ROUNDS forks of each (default 3), each child removed before
# the next, for each vmfork binary given (e.g. an older build next to this
# one). One line per fork: binary, source, round, pause_ms (the fork's
# --json) and, where the driver logs them, the RAM mode, the bytes copied
# inside the pause and the pause's phases. Needs scripts/libvirtd.sh and
# `vmfork libvirt setup` once; uses its own state and mem dirs, removed after.
#
#   scripts/flatpause-libvirt.sh bin/vmfork
set -euo pipefail
G=${VMFORK_GUEST:-/var/cache/vmfork/guest}
rounds=${ROUNDS:-3}
err=$(mktemp)
trap 'rm -f "$err"' EXIT
for bin in "$@"; do
  tag=$(basename "$bin")
  st=$(mktemp -d /tmp/flatpause-st.XXXXXX)
  mem=$(mktemp -d /dev/shm/flatpause-mem.XXXXXX)
  V=("$bin" --state-dir "$st" --mem-dir "$mem" --connect qemu:///system)
  for cfg in "512M 0" "2G 1228"; do
    read -r size use <<<"$cfg"
    src=flatpause-$RANDOM
    "${V[@]}" boot "$src" --kernel "$G/vmlinuz" --initrd "$G/initrd.gz" --disk "$G/data.qcow2" --memory "$size" >/dev/null 2>&1
    "${V[@]}" exec "$src" -- vmfork-counter start >/dev/null
    if [ "$use" != 0 ]; then
      # 1 MiB of urandom, catenated: urandom for the whole size is minutes under TCG.
      "${V[@]}" exec "$src" -- sh -c "mkdir -p /fill && mount -t tmpfs -o size=$((use + 1))m fill /fill &&
        head -c 1048576 /dev/urandom >/fill/seed && i=0 &&
        while [ \$i -lt $use ]; do cat /fill/seed; i=\$((i + 1)); done >/fill/data && grep Shmem: /proc/meminfo" >&2
    fi
    for r in $(seq "$rounds"); do
      if ! out=$("${V[@]}" --log-level debug fork "$src" "$src-c$r" --json 2>"$err"); then
        tail -3 "$err" >&2
        exit 1
      fi
      pause=$(printf '%s' "$out" | python3 -c 'import json, sys; print(json.load(sys.stdin)["pause_ms"])')
      # The driver's "frozen" line: RAM mode, bytes copied in the pause, phases.
      log=$(grep 'msg=frozen' "$err" | grep -o 'ram_mode=[a-z]*\|paused_copy_bytes=[0-9]*\|[a-z]*_ms=[0-9.]*' | tr '\n' ' ' || true)
      echo "$tag $size use=${use}M round=$r pause_ms=$pause ${log:-(no RAM plan in the log)}"
      "${V[@]}" rm "$src-c$r" >/dev/null 2>&1
    done
    "${V[@]}" rm "$src" >/dev/null 2>&1
  done
  rm -rf "$st" "$mem"
done
