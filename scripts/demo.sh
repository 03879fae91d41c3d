#!/usr/bin/env bash
# The vmfork demo: boots the test guest with a counter running in it, forks it
# into three children, and shows that every child continues the same counter
# process from the instant of the fork, then goes its own way; then keeps an
# instant as a template with a warm pool and forks from it later.
# Run it with `make demo`. It uses a state dir and mem dir of its own and
# removes them, and every machine it made, at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${VMFORK_BIN:-bin/vmfork}
guest=${VMFORK_GUEST:-/var/cache/vmfork/guest}
export VMFORK_STATE_DIR=${VMFORK_STATE_DIR:-$(mktemp -d /tmp/vmfork-demo.XXXXXX)}
export VMFORK_MEM_DIR=${VMFORK_MEM_DIR:-$(mktemp -d /dev/shm/vmfork-demo.XXXXXX)}
cleanup() {
  "$bin" -q template rm golden >/dev/null 2>&1 || true
  "$bin" -q rm --force demo demo-1 demo-2 demo-3 golden-1 golden-2 >/dev/null 2>&1 || true
  rm -rf "$VMFORK_STATE_DIR" "$VMFORK_MEM_DIR"
}
trap cleanup EXIT

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { step "$@"; "$@"; }

step vmfork boot demo --kernel "$guest/vmlinuz" --initrd "$guest/initrd.gz" --disk "$guest/data.qcow2" --memory 256M
"$bin" -q boot demo --kernel "$guest/vmlinuz" --initrd "$guest/initrd.gz" --disk "$guest/data.qcow2" --memory 256M
run "$bin" exec demo -- vmfork-counter start
sleep 2
run "$bin" exec demo -- sh -c 'echo "written before the fork, never synced" > /data/note'

step vmfork fork demo --count 3
fork=$("$bin" -q fork demo --count 3)
echo "$fork"

# The READY column of the fork's table: from the start of the child's
# creation until its guest agent answered.
ready() { echo "$fork" | awk -v m="$1" '$1 == m { print $6 " " $7 }'; }
# One exec per machine, all at once, so the counters are read at about the
# same moment.
probe() {
  "$bin" exec "$1" -- sh -c 'echo "$(cat /run/counter.pid 2>/dev/null || echo stopped) $(cat /run/counter) $(hostname) $(cat /sys/class/net/eth0/address) $(cat /data/note)"'
}
table() {
  local dir m
  dir=$(mktemp -d)
  for m in demo demo-1 demo-2 demo-3; do probe "$m" >"$dir/$m" & done
  wait
  printf '%-8s %-7s %-12s %-8s %-8s %-13s %-18s %s\n' MACHINE PARENT COUNTER_PID COUNTER READY HOSTNAME MAC NOTE
  for m in demo demo-1 demo-2 demo-3; do
    read -r pid n host mac note <"$dir/$m"
    parent=demo r=$(ready "$m")
    [ "$m" = demo ] && parent=-
    printf '%-8s %-7s %-12s %-8s %-8s %-13s %-18s %s\n' "$m" "$parent" "$pid" "$n" "${r:--}" "$host" "$mac" "$note"
  done
  rm -rf "$dir"
}
echo
echo "Right after the fork every child runs the source's counter process (same PID),"
echo "continuing its count from the instant of the fork, and has the unsynced file;"
echo "each has its own hostname and MAC (READY includes giving it that identity):"
table

step vmfork exec demo-2 -- vmfork-counter stop
"$bin" exec demo-2 -- vmfork-counter stop
sleep 2
echo
echo "Two seconds later each machine went its own way (demo-2's counter was stopped):"
table

echo
echo "Keep this instant of demo as a template, with two QEMU processes started ahead;"
echo "children forked from it later continue from here, the source untouched:"
run "$bin" -q template save demo golden --pool 2
run "$bin" exec demo -- sh -c 'echo "written after the save" > /data/note'
run "$bin" -q fork golden --count 2
run "$bin" exec golden-1 -- cat /data/note
run "$bin" template ls

run "$bin" ls
run "$bin" -q template rm golden
run "$bin" rm demo-1 demo-2 demo-3 golden-1 golden-2 demo
