#!/usr/bin/env bash
# Memory per file of a prepfs daemon: N sparse 512-byte files in one directory, `ls -l` of the
# mount, then a sorted and a shuffled pass reading every file (Python, one thread), as the scale
# bench does. Prints the daemon's RSS per file after the listing and after the reads (less the
# empty mount's), beside what the memory budget was charged per file over the same span (its
# cache slice's used bytes: cached bytes, entries, inode nodes, the planner's files), and with
# heaptrack (Debian package heaptrack) its peak heap and the peak's bytes per file grouped by
# the call sites that made them (the last frames before the allocator).
#
#   benches/memory/heap.sh PREPFS_BINARY N [heaptrack]
#
# As root, with /dev/fuse. The dataset is made once under ${PREPFS_BENCH_DIR:-/var/tmp} and kept.
# One run is one sample: compare builds interleaved, several runs each (RSS moves with where the
# allocator finds memory; the peak heap much less).
set -euo pipefail
BIN=$(realpath "$1") N=$2 MODE=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${PREPFS_BENCH_DIR:-/var/tmp}/prepfs-heap-$N
SRC=$BASE/data
if [ ! -e "$BASE/complete" ]; then
  mkdir -p "$SRC"
  python3 -c '
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    with open(os.path.join(d, "n%08d_%07d.JPEG" % (i % 1000, i)), "wb") as f:
        f.truncate(512)' "$SRC" "$N"
  touch "$BASE/complete"
fi
MNT=$(mktemp -d /tmp/prepfs-heap-mnt.XXXX)
OUT=$(mktemp -d /tmp/prepfs-heap-out.XXXX)
run=("$BIN" mount "$SRC" "$MNT" --foreground --cache-mem 3G)
if [ "$MODE" = heaptrack ]; then
  command -v heaptrack >/dev/null || { echo "heap.sh: needs heaptrack (apt-get install heaptrack)" >&2; exit 1; }
  run=(heaptrack -o "$OUT/heap" "${run[@]}")
fi
"${run[@]}" >"$OUT/daemon.log" 2>&1 &
trap 'umount "$MNT" 2>/dev/null || true; rmdir "$MNT" 2>/dev/null || true' EXIT
for _ in $(seq 600); do [ -e "$MNT/.prepfs/stats.json" ] && break; sleep 0.1; done
PID=$(pgrep -f "^$BIN mount $SRC" | head -1)
rss() { awk '/VmRSS/{print $2}' "/proc/$PID/status"; }
charged() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["memory"]["cache"]["used_bytes"])' "$MNT/.prepfs/stats.json"; }
R0=$(rss) C0=$(charged)
ls -l "$MNT" >/dev/null
R1=$(rss)
python3 - "$MNT" <<'PY'
import os, random, sys
m = sys.argv[1]
names = sorted(n for n in os.listdir(m) if n != ".prepfs")
for p in range(2):
    if p == 1:
        random.Random(7).shuffle(names)
    for n in names:
        with open(os.path.join(m, n), "rb") as f:
            assert len(f.read()) == 512
PY
sleep 1
R2=$(rss) C2=$(charged)
echo "RSS KiB: empty $R0, listed $R1, read $R2; per file: after ls -l $(( (R1 - R0) * 1024 / N )) B, after reads $(( (R2 - R0) * 1024 / N )) B, charged to the budget $(( (C2 - C0) / N )) B"
kill -TERM "$PID"
wait || true
if [ "$MODE" = heaptrack ]; then
  heaptrack_print "$OUT/heap.zst" 2>/dev/null | grep "peak heap"
  heaptrack_print -f "$OUT/heap.zst" --flamegraph-cost-type peak -F "$OUT/peak.folded" >/dev/null 2>&1
  python3 "$HERE/by_site.py" "$OUT/peak.folded" "$N"
fi
echo "heaptrack data and the daemon's log: $OUT"
