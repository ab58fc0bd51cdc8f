#!/usr/bin/env bash
# `prepfs warm` into a cache smaller than the data: 4 files of 3 MiB and 12 of 256 KiB (15 MiB),
# `--cache-mem 8M` (a 6 MiB cache slice), warmed with the default 4 readers, RUNS times. Prints
# how many runs left a file cached in part (never-evict then holds bytes no read can use whole)
# and each run's "warmed N files".
#
#   benches/warm/fit.sh PREPFS_BINARY [RUNS]
#
# As root, with /dev/fuse and fusermount3.
set -euo pipefail
BIN=$(realpath "$1") RUNS=${2:-10}
DIR=$(mktemp -d /tmp/prepfs-warm-fit.XXXX)
trap 'fusermount3 -u "$DIR/mnt" 2>/dev/null || true; rm -rf "$DIR"' EXIT
mkdir -p "$DIR/src/small" "$DIR/src/large" "$DIR/mnt"
for i in $(seq -w 0 11); do head -c 262144 /dev/urandom >"$DIR/src/small/$i"; done
for i in 0 1 2 3; do head -c 3145728 /dev/urandom >"$DIR/src/large/$i"; done
# Older than the settle time: files still being written are served but not cached.
touch -d '1 hour ago' "$DIR"/src/*/*
partial=0 warmed=""
for _ in $(seq "$RUNS"); do
  "$BIN" mount "$DIR/src" "$DIR/mnt" --foreground --cache-mem 8M --codec none \
    --prefetch-buffer 0 2>/dev/null &
  for _ in $(seq 100); do [ -e "$DIR/mnt/.prepfs/stats.json" ] && break; sleep 0.1; done
  line=$("$BIN" warm "$DIR/mnt" 2>/dev/null | head -1)
  split=$(python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))["cache"]
print(c["files"] - c["complete_files"])' "$DIR/mnt/.prepfs/stats.json")
  [ "$split" -gt 0 ] && partial=$((partial + 1))
  warmed="$warmed ${line%%,*}"
  fusermount3 -u "$DIR/mnt"
  wait
done
echo "runs leaving a file cached in part: $partial of $RUNS;$warmed"
