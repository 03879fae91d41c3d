#!/usr/bin/env bash
# Forks of forks and an agent's loop on the libvirt driver (docs/BENCHMARKS.md,
# "Flat pause", libvirt): what `vmfork bench scale --depth 5 --loop 20` measures
# for the embedded driver, through the product CLI with --connect (bench scale
# has no libvirt driver). A MEM MiB source (default 512) holding USE MiB of
# non-zero data (default 256, a tmpfs in the guest), as the embedded figures'
# --child-memory 512M --depth-use 50%, then:
#   depth  forked ROUNDS times (default 2) per level, the last child kept as
#          the next level's source, which writes 4 MiB before it is forked,
#          DEPTH levels (default 5): pause_ms, running_ms, ready_ms per fork;
#   loop   a second such source forked LOOP times (default 20), each child
#          removed before the next fork and 2 MiB written in the source in
#          between: pause_ms per fork, the source QEMU's PSS and the mem dir's
#          allocated bytes after the first and the last fork.
# Then the ratios of issue 11. Needs scripts/libvirtd.sh and `vmfork libvirt
# setup` once; uses its own state and mem dirs, removed after, also on failure.
#
#   scripts/depth-loop-libvirt.sh bin/vmfork
#   DEPTH=0 scripts/depth-loop-libvirt.sh bin/vmfork     (the loop only)
#   LOOP=0 ROUNDS=4 scripts/depth-loop-libvirt.sh bin/vmfork   (the depth sweep only)
#   ORDER=interleaved LOOP=0 ROUNDS=4 scripts/depth-loop-libvirt.sh bin/vmfork
#     builds the whole chain first and then forks every level once per round
#     (order reversed every other round), each child removed: the levels see
#     the same host load and the same running guests (the sweep measures
#     depth 1 minutes before depth 5, with 1 and 6 guests running).
# Each depth line ends with the driver's phases of that pause (its debug log's
# "frozen" line: ram_mode, snapshot_ms, devstate_ms, ram_ms, cont_ms, ...);
# the summary gives their medians per level.
set -euo pipefail
bin=${1:?usage: $0 path/to/vmfork}
G=${VMFORK_GUEST:-/var/cache/vmfork/guest}
rounds=${ROUNDS:-2} depth=${DEPTH:-5} order=${ORDER:-sweep} loop=${LOOP:-20} msize=${MEM:-512} use=${USE:-256}
st=$(mktemp -d /tmp/depthloop-st.XXXXXX)
mem=$(mktemp -d /dev/shm/depthloop-mem.XXXXXX)
out=$(mktemp)
err=$(mktemp)
V=("$bin" --state-dir "$st" --mem-dir "$mem" --connect qemu:///system)
tag=dl$$
cleanup() {
  # Children before their sources: the newest records first.
  for m in $("${V[@]}" ls --json 2>/dev/null | python3 -c 'import json,sys; print(" ".join(m["name"] for m in reversed(json.load(sys.stdin))))' 2>/dev/null); do
    "${V[@]}" rm --force "$m" >/dev/null 2>&1 || true
  done
  rm -rf "$st" "$mem" "$out" "$err"
}
trap cleanup EXIT
boot() { # name: a MEM MiB source holding USE MiB
  "${V[@]}" boot "$1" --kernel "$G/vmlinuz" --initrd "$G/initrd.gz" --disk "$G/data.qcow2" --memory "${msize}M" >/dev/null
  "${V[@]}" exec "$1" -- sh -c "mkdir -p /fill && mount -t tmpfs -o size=$((use + 1))m fill /fill &&
    head -c 1048576 /dev/urandom >/fill/seed && i=0 &&
    while [ \$i -lt $use ]; do cat /fill/seed; i=\$((i + 1)); done >/fill/data" >/dev/null
}
fork() { # source child: prints pause_ms running_ms ready_ms, then the pause's phases
  local res
  res=$("${V[@]}" --log-level debug fork "$1" "$2" --json 2>"$err") || { tail -3 "$err" >&2; return 1; }
  printf '%s' "$res" | python3 -c 'import json,sys; r=json.load(sys.stdin); c=r["children"][0]; print(r["pause_ms"], c["running_ms"], c["ready_ms"], end=" ")'
  # The driver's "frozen" line: RAM mode, libvirt's snapshot call, the
  # source's disk chain, and each phase of the pause (libvirtdrv/fork.go).
  grep 'msg=frozen' "$err" | grep -o 'ram_mode=[a-z]*\|backing_chain=[0-9]*\|paused_copy_bytes=[0-9]*\|[a-z]*_ms=[0-9.]*' | tr '\n' ' ' || true
  echo
}
pss() { # machine: its QEMU's PSS in bytes
  awk '/^Pss:/ {print $2 * 1024}' "/proc/$(cat "/run/libvirt/qemu/$1.pid")/smaps_rollup"
}
echo "load $(cut -d' ' -f1-3 /proc/loadavg) at start" >&2
cur=$tag-d0
[ "$depth" = 0 ] || boot "$cur"
if [ "$order" = interleaved ]; then
  # The chain first (d0 booted, each dK a child of dK-1 that wrote 4 MiB),
  # every level kept; then the rounds, each forking every level once (level
  # order reversed every other round), the source writing 2 MiB first and
  # the child removed after: depth 1 and depth DEPTH are measured minutes
  # apart no more, with the same guests running.
  for d in $(seq "$depth"); do
    "${V[@]}" fork "$tag-d$((d - 1))" "$tag-d$d" >/dev/null
    "${V[@]}" exec "$tag-d$d" -- sh -c 'head -c 4194304 /dev/urandom > /run/depth-step' >/dev/null
  done
  for r in $(seq "$rounds"); do
    levels=$(seq "$depth")
    [ $((r % 2)) = 1 ] || levels=$(seq "$depth" -1 1)
    for d in $levels; do
      s=$tag-d$((d - 1)) c=$tag-x$d-$r
      "${V[@]}" exec "$s" -- sh -c 'head -c 2097152 /dev/urandom > /run/round-step' >/dev/null
      echo "depth $d round $r $(fork "$s" "$c")" | tee -a "$out"
      "${V[@]}" rm --force "$c" >/dev/null
    done
  done
  depth=0 # measured
fi
for d in $(seq "$depth"); do
  for r in $(seq "$rounds"); do
    c=$tag-d$d-$r
    echo "depth $d round $r $(fork "$cur" "$c")" | tee -a "$out"
    [ "$r" = "$rounds" ] || "${V[@]}" rm --force "$c" >/dev/null
  done
  cur=$tag-d$d-$rounds
  "${V[@]}" exec "$cur" -- sh -c 'head -c 4194304 /dev/urandom > /run/depth-step'
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg) after the depth sweep" >&2
src=$tag-loop
[ "$loop" = 0 ] || boot "$src"
for i in $(seq "$loop"); do
  read -r pause _ _ <<<"$(fork "$src" "$src-$i")"
  "${V[@]}" rm --force "$src-$i" >/dev/null
  extra=""
  if [ "$i" = 1 ] || [ "$i" = "$loop" ]; then
    extra="pss $(pss "$src") memdir $(du -sB1 "$mem" | cut -f1)"
  fi
  echo "loop $i pause $pause $extra" | tee -a "$out"
  if [ "$i" != "$loop" ]; then
    "${V[@]}" exec "$src" -- sh -c "head -c 2097152 /dev/urandom > /run/loop-$i"
  fi
done
python3 - "$out" "$loop" <<'PY'
import statistics as s, sys
lines = [l.split() for l in open(sys.argv[1])]
loop = int(sys.argv[2])
dep, phases = {}, {}
for l in lines:
    if l[0] == "depth":
        d = int(l[1])
        dep.setdefault(d, []).append((float(l[4]), float(l[5]), float(l[6])))
        for kv in l[7:]:
            k, _, v = kv.partition("=")
            if k.endswith("_ms"):
                phases.setdefault(d, {}).setdefault(k, []).append(float(v))
med = {d: [s.median(x[i] for x in v) for i in range(3)] for d, v in dep.items()}
for d in sorted(med):
    ph = " ".join(f"{k} {s.median(v):.1f}" for k, v in sorted(phases.get(d, {}).items()))
    print(f"depth {d}: median pause {med[d][0]:.0f} ms, running {med[d][1]:.0f} ms, ready {med[d][2]:.0f} ms; phases (medians, ms): {ph}")
if len(med) >= 2:
    last = max(med)
    print(f"pause depth {last} / depth 1 = {med[last][0] / med[1][0]:.2f} (target <= 1.2)")
    print(f"child running depth {last} / depth 1 = {med[last][1] / med[1][1]:.2f} (target <= 1.2)")
lp = [l for l in lines if l[0] == "loop"]
if not lp:
    sys.exit(0)
pauses = [float(l[3]) for l in lp]
q = max(len(pauses) // 4, 1)
print(f"loop: pauses {' '.join(f'{p:.0f}' for p in pauses)} ms; first quarter median {s.median(pauses[:q]):.0f}, last {s.median(pauses[-q:]):.0f}")
first, lastl = lp[0], lp[-1]
p1, pn = int(first[5]), int(lastl[5])
written = 2 * 1048576 * (loop - 1)
print(f"source PSS after fork 1 {p1 / 2**20:.1f} MiB, after fork {loop} {pn / 2**20:.1f} MiB; guest wrote {written / 2**20:.0f} MiB between;"
      f" ratio PSS_last / (PSS_first + written) = {pn / (p1 + written):.2f} (target <= 1.1)")
print(f"mem dir after fork 1 {int(first[7]) / 2**20:.1f} MiB, after fork {loop} {int(lastl[7]) / 2**20:.1f} MiB")
PY
