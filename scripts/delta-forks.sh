#!/usr/bin/env bash
# Forks 1..N of one source with every child kept (docs/DELTAS.md, "Delta
# templates" and "Delta chains"; issue 27), for each vmfork binary given
# (this build, and an older one to compare). The source (MEM, default 1G)
# holds USE MiB (default 512) of non-zero data in a guest tmpfs and writes
# WRITE MiB (default 8) of new data between forks. One line per fork:
# binary, fork number, the fork's whole call (wall clock around `vmfork
# fork`), its pause_ms and the child's ready_ms (--json), the RAM mode, chain
# length and the bytes copied before and in the pause (the driver's debug
# log), the time to apply the deltas in the child, the mem dir's allocated
# bytes after the fork (du, each file once however many names it has), and
# the template's RAM kind and size (template ls --json). After the N forks:
# the mem dir against the used RAM (the first template's file) plus the sum
# of the deltas, and `template compact` of the last template (its cost).
#
# BURST=K (e.g. 16) then measures a K-child burst from a delta template with
# and without compaction, on the same source: a fork with --no-delta first
# (the source starts its deltas again on a fresh file; that child is kept so
# the file stays a template's), WRITE MiB written, then `fork -n K` (a delta
# template: K x WRITE is under half the base) and, its children removed,
# `fork -n K --no-delta` (one full file copied while the source runs). Per
# burst: the whole call, pause, the children's ready_ms (median, max) and
# the anonymous memory per child QEMU (smaps_rollup: its private pages,
# the applied deltas among them). Uses its own state and mem dirs, removed
# after. CHAIN_ONLY=1 with BURST skips nothing; N=1 runs the burst alone.
#
# Each fork's line has the 1-minute load average after it (load1) and the
# child's "delta applied" figures: the chain's bytes, those mapped from the
# delta files (in how many runs) and copied (sharedmem/overlay.go).
# STOP_KEPT=1 stops each kept child's QEMU (SIGSTOP) after its fork and
# lets them go on after the control fork: the forks (and the control) then
# run without the kept guests' TCG load (20 idle guests at 0.3-0.5 CPU each
# on 2 cores; on KVM an idle guest costs next to nothing).
#
# ROTATE=K keeps only the last K files written between forks (the older
# ones removed in the guest): the source changes WRITE MiB between forks
# but its data stays at about USE + K x WRITE MiB, so that a 4 GiB guest
# holding 3 GiB can be forked 20 times (the issue's figures; without it the
# guest's tmpfs must hold USE + N x WRITE).
#
#   N=20 MEM=2G USE=1536 WRITE=25 BURST=16 scripts/delta-forks.sh bin/vmfork
set -euo pipefail
G=${VMFORK_GUEST:-/var/cache/vmfork/guest}
N=${N:-5} MEM=${MEM:-1G} USE=${USE:-512} WRITE=${WRITE:-8} BURST=${BURST:-0} STOP_KEPT=${STOP_KEPT:-0} ROTATE=${ROTATE:-0}
stopped=()
err=$(mktemp)
trap 'rm -f "$err"; [ ${#stopped[@]} -eq 0 ] || kill -CONT "${stopped[@]}" 2>/dev/null || true' EXIT
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

# write F MiB into /fill/NAME in the guest (1 MiB of urandom, catenated:
# urandom for the whole size is minutes under TCG).
write() {
  "${V[@]}" exec "$src" -- sh -c "head -c 1048576 /dev/urandom >/fill/seed && i=0 &&
    while [ \$i -lt $2 ]; do cat /fill/seed; i=\$((i + 1)); done >/fill/$1" >&2
}

# anon_mib PID: the anonymous memory of a QEMU (its private pages).
anon_mib() { awk '/^Anonymous:/ {print int($2 / 1024)}' "/proc/$1/smaps_rollup"; }

burst() { # burst LABEL FLAGS...: one K-child fork, one line, children removed
  local label=$1 t0 out whole
  shift
  t0=$(date +%s%N)
  out=$("${V[@]}" --log-level debug fork "$src" -n "$BURST" --json "$@" 2>"$err") || { tail -3 "$err" >&2; exit 1; }
  whole=$(ms "$t0")
  local mode
  mode=$(grep -o 'ram_mode=[a-z]*' "$err" | head -1 || true)
  printf '%s' "$out" | python3 -c '
import json, statistics, sys
r = json.load(sys.stdin)
rd = sorted(c["ready_ms"] for c in r["children"])
anon = []
for c in r["children"]:
    for l in open("/proc/%d/smaps_rollup" % c["pid"]):
        if l.startswith("Anonymous:"):
            anon.append(int(l.split()[1]) // 1024)
print("burst=%s children=%d whole_ms=%s pause_ms=%.1f ready_median_ms=%.0f ready_max_ms=%.0f anon_per_child_MiB=%.0f %s" % (
    sys.argv[1], len(rd), sys.argv[2], r["pause_ms"], statistics.median(rd), rd[-1], statistics.mean(anon), sys.argv[3]))
' "$label" "$whole" "$mode"
  held=$(du -s -B1 "$mem" | cut -f1)
  echo "burst=$label memdir_MiB=$((held >> 20))"
  printf '%s' "$out" | python3 -c 'import json, sys; print(" ".join(c["name"] for c in json.load(sys.stdin)["children"]))' |
    xargs "${V[@]}" rm >/dev/null 2>&1
}

for bin in "$@"; do
  tag=$bin
  st=$(mktemp -d /tmp/delta-st.XXXXXX)
  mem=$(mktemp -d /dev/shm/delta-mem.XXXXXX)
  V=("$bin" --state-dir "$st" --mem-dir "$mem")
  src=delta-$RANDOM
  "${V[@]}" boot "$src" --kernel "$G/vmlinuz" --initrd "$G/initrd.gz" --disk "$G/data.qcow2" --memory "$MEM" >/dev/null 2>&1
  "${V[@]}" exec "$src" -- vmfork-counter start >/dev/null
  "${V[@]}" exec "$src" -- sh -c "mkdir -p /fill && mount -t tmpfs -o size=$((USE + (N + 2) * WRITE + 8))m fill /fill" >&2
  write data "$USE"
  for f in $(seq "$N"); do
    [ "$f" -gt 1 ] && write "w$f" "$WRITE"
    if [ "$ROTATE" -gt 0 ] && [ "$f" -gt $((ROTATE + 1)) ]; then
      "${V[@]}" exec "$src" -- rm -f "/fill/w$((f - ROTATE))" >&2
    fi
    t0=$(date +%s%N)
    if ! out=$("${V[@]}" --log-level debug fork "$src" "$src-c$f" --json 2>"$err"); then
      tail -3 "$err" >&2
      exit 1
    fi
    whole=$(ms "$t0")
    read -r pause ready tpl cpid < <(printf '%s' "$out" | python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["pause_ms"], r["children"][0].get("ready_ms", 0), r["template"], r["children"][0]["pid"])')
    log=$(grep 'msg=frozen\|msg="delta applied"' "$err" | grep -o 'ram_mode=[a-z]*\|[a-z]*_ms=[0-9.]*\|chain=[0-9]*\|precopied_bytes=[0-9]*\|paused_copy_bytes=[0-9]*\|delta_ms=[0-9.]*\|delta_depth=[0-9]*\|delta_bytes=[0-9]*\|delta_mapped_bytes=[0-9]*\|delta_mapped_runs=[0-9]*\|delta_copied_bytes=[0-9]*' | tr '\n' ' ' || true)
    held=$(du -s -B1 "$mem" | cut -f1)
    kind=$("${V[@]}" template ls --json | python3 -c 'import json, sys
for t in json.load(sys.stdin):
    if t["id"] == sys.argv[1]:
        print("kind=%s depth=%d own_MiB=%.1f" % (t.get("ram_kind", "?"), t.get("chain_depth", 0), t["ram_bytes"] / 2**20))' "$tpl")
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "$tag fork=$f whole_ms=$whole pause_ms=$pause ready_ms=$ready memdir_MiB=$((held >> 20)) load1=$load $kind $log"
    if [ "$STOP_KEPT" = 1 ]; then
      # The kept child's QEMU stopped (SIGSTOP) until the control fork:
      # the next forks then run without its TCG load.
      kill -STOP "$cpid"
      stopped+=("$cpid")
    fi
  done
  # The goal: the mem dir against the used RAM (the first template's file)
  # plus the sum of the deltas (each template's own).
  "${V[@]}" template ls --json | python3 -c '
import json, sys
ts = json.load(sys.stdin)
full = [t["ram_bytes"] for t in ts if t.get("ram_kind") == "full"]
deltas = sum(t["ram_bytes"] for t in ts if t.get("ram_kind") == "delta")
used = min(full) if full else 0
held = int(sys.argv[1])
print("%s templates=%d full=%d used_MiB=%.0f deltas_MiB=%.0f memdir_MiB=%.0f ratio=%.2f" % (
    sys.argv[2], len(ts), len(full), used / 2**20, deltas / 2**20, held / 2**20, held / max(1, used + deltas)))
' "$(du -s -B1 "$mem" | cut -f1)" "$tag"
  if [ "$N" -gt 1 ]; then
    # The cost of compacting the deepest chain into a full file.
    "${V[@]}" template compact "$tpl" --json | python3 -c 'import json, sys; r = json.load(sys.stdin); print("compact depth=%d written_MiB=%.0f ms=%.0f" % (r["chain_depth"], r["written_bytes"] / 2**20, r["elapsed_ms"]))'
  fi
  if [ "$N" -gt 1 ]; then
    # The control: a child of a full file (--no-delta), forked now, under
    # the same load (the N children kept) as the N-th fork's child.
    free -m | awk '/^Mem:/ {print "host_mem_used_MiB=" $3 " available_MiB=" $7}'
    t0=$(date +%s%N)
    out=$("${V[@]}" fork "$src" "$src-full" --no-delta --json 2>"$err") || { tail -3 "$err" >&2; exit 1; }
    whole=$(ms "$t0")
    printf '%s' "$out" | python3 -c 'import json, sys; r = json.load(sys.stdin); print("control (full file) whole_ms=%s pause_ms=%.1f ready_ms=%.0f" % (sys.argv[1], r["pause_ms"], r["children"][0]["ready_ms"]))' "$whole"
    "${V[@]}" rm "$src-full" >/dev/null 2>&1
  fi
  if [ ${#stopped[@]} -gt 0 ]; then
    kill -CONT "${stopped[@]}"
    stopped=()
  fi
  for f in $(seq "$N"); do "${V[@]}" rm "$src-c$f" >/dev/null 2>&1; done
  if [ "$BURST" -gt 0 ]; then
    out=$("${V[@]}" fork "$src" "$src-reset" --no-delta --json 2>"$err") || { tail -3 "$err" >&2; exit 1; }
    write burst "$WRITE"
    burst delta
    burst full --no-delta
    "${V[@]}" rm "$src-reset" >/dev/null 2>&1
  fi
  "${V[@]}" rm "$src" >/dev/null 2>&1
  rm -rf "$st" "$mem"
done
