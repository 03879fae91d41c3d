#!/usr/bin/env bash
# The vmfork demo: boots the test guest with a counter running in it, forks it
# into three children, and shows that every child continues the same counter
# process from the instant of the fork, then goes its own way.
# Run it with `make demo`. It uses a state dir and mem dir of its own and
# removes them, and every machine it made, at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${VMFORK_BIN:-bin/vmfork}
guest=${VMFORK_GUEST:-tests/guest/out}
export VMFORK_STATE_DIR=${VMFORK_STATE_DIR:-$(mktemp -d /tmp/vmfork-demo.XXXXXX)}
export VMFORK_MEM_DIR=${VMFORK_MEM_DIR:-$(mktemp -d /dev/shm/vmfork-demo.XXXXXX)}
cleanup() {
  "$bin" -q rm --force demo demo-1 demo-2 demo-3 >/dev/null 2>&1 || true
  rm -rf "$VMFORK_STATE_DIR" "$VMFORK_MEM_DIR"
}
trap cleanup EXIT

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { step "$@"; "$@"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

step vmfork boot demo --kernel "$guest/vmlinuz" --initrd "$guest/initrd.gz" --disk "$guest/data.qcow2" --memory 256M
"$bin" -q boot demo --kernel "$guest/vmlinuz" --initrd "$guest/initrd.gz" --disk "$guest/data.qcow2" --memory 256M
run "$bin" exec demo -- vmfork-counter start
sleep 2
run "$bin" exec demo -- sh -c 'echo "written before the fork, never synced" > /data/note'

step vmfork fork demo --count 3
fork=$("$bin" -q fork demo --count 3 --json)
echo "$fork" | json 'f"template {d[\"template\"]}: source paused {d[\"pause_ms\"]:.0f} ms"'

ready() { echo "$fork" | json "next((f'{c[\"ready_ms\"]:.0f} ms' for c in d['children'] if c['name']=='$1'), '-')"; }
table() {
  printf '%-8s %-8s %-12s %-10s %-10s %s\n' MACHINE PARENT COUNTER_PID COUNTER READY NOTE
  for m in demo demo-1 demo-2 demo-3; do
    parent=$([ "$m" = demo ] && echo - || echo demo)
    pid=$("$bin" exec "$m" -- cat /run/counter.pid)
    n=$("$bin" exec "$m" -- cat /run/counter)
    note=$("$bin" exec "$m" -- cat /data/note)
    printf '%-8s %-8s %-12s %-10s %-10s %s\n' "$m" "$parent" "$pid" "$n" "$(ready "$m")" "$note"
  done
}
echo
echo "Right after the fork, every child runs the source's counter process (same PID)"
echo "and continues its count from the instant of the fork:"
table

step vmfork exec demo-2 -- vmfork-counter stop
"$bin" exec demo-2 -- vmfork-counter stop
sleep 2
echo
echo "Two seconds later each machine went its own way (demo-2's counter was stopped):"
table

run "$bin" ls
run "$bin" rm demo-1 demo-2 demo-3 demo
