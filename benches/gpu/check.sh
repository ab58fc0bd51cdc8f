#!/usr/bin/env bash
# The GPU backend's checks, in one go, on a machine with an NVIDIA GPU and driver (issues 8, 39):
#   0. what the machine has: GPU, driver, /dev/fuse, the CUDA libraries prepfs will load
#   1. the feature's tests that need no GPU (NVRTC kernel compile, mirror equivalence, batching)
#   2. the GPU tests (#[ignore]d elsewhere): GPU == CPU renders on random images and crops,
#      nvJPEG within the documented tolerance, the --gpu-mem cap
#   3. the equivalence test again while a training-like process keeps the GPU busy
#   4. the DataLoader benchmark: prepfs GPU path vs prepfs CPU path vs torchvision
#      decode_jpeg(device='cuda') + v2 transforms, on at most $CORES CPU cores, GPU busy then idle
# Each step runs even when an earlier one failed; the report ends with a line per step and the
# script exits non-zero when any failed.
#
#   benches/gpu/check.sh                 build here (cargo, --features cuda, offline) and check
#   benches/gpu/check.sh --pack DIR      build here and copy what the checks run into DIR, for a
#                                        GPU machine without Rust (its glibc as new as this one's)
#   PREBUILT=DIR benches/gpu/check.sh    check with DIR's binaries, no cargo
#
# BASELINE=PATH benches a second prepfs binary beside this one (prepfs-gpu-baseline), for a
# before/after on the same machine in one run; BENCH_BUSY=0 skips the busy-GPU benchmark;
# VIEW=train=... benches another view (its name must stay `train`), MOUNT_ARGS adds options to
# every mount (`--decoded-cache off`: every epoch decodes, on nvJPEG for the GPU mount).
# Reports land in $OUT (default target/gpu-check): report.md, the step logs, bench-*.json,
# stats-*.json. Images and mounts go to $WORK (default $OUT/work). Needs root (FUSE mounts) and a
# Python with CUDA torch + torchvision (PREPFS_CUDA_PYTHON, a venv or prefix, default
# ~/.cache/prepfs/venv; its pip libraries also provide NVRTC and nvJPEG).
set -uo pipefail
cd "$(dirname "$0")/../.."

build() {  # prints the paths of the prepfs binary, the lib tests and the GPU tests
  cargo build --release --offline --features cuda >&2 || return 1
  echo target/release/prepfs
  cargo test --release --offline --features cuda --no-run --lib --test gpu --message-format=json \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])'
}

if [ "${1:-}" = --pack ]; then
  dir=${2:?--pack DIR}
  mkdir -p "$dir"
  mapfile -t bins < <(build) && [ "${#bins[@]}" = 3 ] || { echo "check.sh: build failed" >&2; exit 1; }
  for b in "${bins[@]}"; do
    case $b in */deps/prepfs-*) name=lib-tests ;; */deps/gpu-*) name=gpu-tests ;; *) name=prepfs ;; esac
    strip -o "$dir/$name" "$b"
  done
  ls -la "$dir"
  exit 0
fi

OUT=${OUT:-target/gpu-check}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
WORK=${WORK:-$OUT/work}
mkdir -p "$WORK"
VENV=${PREPFS_CUDA_PYTHON:-$HOME/.cache/prepfs/venv}
CORES=${CORES:-0-3}           # "at most 4 busy CPU cores"
IMAGES=${IMAGES:-20000}
WORKERS=${WORKERS:-3}         # DataLoader workers (blocked on reads, they add no busy cores)
GPU_MEM=${GPU_MEM:-4G}
export PREPFS_CUDA_PYTHON=$VENV PREPFS_REQUIRE_NVRTC=1
PY=$VENV/bin/python3
: >"$OUT/report.md"
say() { printf '\n## %s\n' "$*" | tee -a "$OUT/report.md" >&2; }
results=()
step() {  # $1: name; the rest: the command. Records PASS/FAIL, never stops the script.
  local name=$1; shift
  local start=$SECONDS
  if "$@"; then results+=("PASS $name ($((SECONDS - start)) s)")
  else results+=("FAIL $name ($((SECONDS - start)) s)"); fi
}

say "0. the machine"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  echo "kernel $(uname -r), $(nproc) CPUs; /dev/fuse: $(ls -l /dev/fuse 2>&1)"
  grep -w fuse /proc/filesystems || echo "fuse: not in /proc/filesystems"
  "$PY" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())' 2>&1
  timeout 30 find /usr/lib /usr/local /opt \( -name 'libnvjpeg*.so*' -o -name 'libnvrtc.so*' -o -name 'libcuda.so*' \) 2>/dev/null | head -20
} | tee -a "$OUT/report.md"

if [ -z "${PREBUILT:-}" ]; then
  say "build (release, --features cuda)"
  PREBUILT=target/gpu-check-bin
  bash benches/gpu/check.sh --pack "$PREBUILT" >&2 || { echo "check.sh: build failed" | tee -a "$OUT/report.md"; exit 1; }
fi
PREPFS=$PREBUILT/prepfs LIB_TESTS=$PREBUILT/lib-tests GPU_TESTS=$PREBUILT/gpu-tests

say "1. feature tests without a GPU (NVRTC compile, mirror == CPU, batcher, placement)"
lib_tests() { "$LIB_TESTS" view:: >"$OUT/lib-tests.txt" 2>&1; local rc=$?; tail -3 "$OUT/lib-tests.txt" | tee -a "$OUT/report.md"; return $rc; }
step "lib tests (view::)" lib_tests

say "2. GPU tests: equivalence, nvJPEG tolerance, memory cap"
gpu_tests() {  # $1: log name; the rest: test filter
  local log=$OUT/$1.txt; shift
  "$GPU_TESTS" --ignored --nocapture --test-threads=1 "$@" >"$log" 2>&1; local rc=$?
  grep -E "^test |compared|nvJPEG|charged|result|panicked|GPU backend" "$log" | tee -a "$OUT/report.md"
  return $rc
}
step "GPU tests" gpu_tests gpu-tests

say "3. equivalence with the GPU busy (a concurrent training-like process)"
"$PY" benches/gpu/busy.py & busy=$!
trap 'kill $busy 2>/dev/null || true' EXIT
sleep 10
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv 2>&1 | tee -a "$OUT/report.md"
PREPFS_GPU_BUSY=1 step "GPU tests, busy GPU" gpu_tests gpu-busy-tests gpu_transforms_equal_cpu_transforms

say "4. DataLoader benchmark ($IMAGES images, $WORKERS workers, cores $CORES, busy GPU: ${BENCH_BUSY:-1}, then idle)"
data=$WORK/images
step "make images" "$PY" benches/gpu/make_images.py "$data" "$IMAGES"
view=${VIEW:-"train=decode,random_resized_crop(224),hflip,normalize(imagenet)"}
bench() {  # $1: label. Mounts prepfs-gpu, prepfs-cpu (and prepfs-gpu-baseline: $BASELINE).
  local rc=0 pids=() mounts=() args=() label bin gpu
  for m in prepfs-gpu:$PREPFS:on prepfs-cpu:$PREPFS:off ${BASELINE:+prepfs-gpu-baseline:$BASELINE:on}; do
    IFS=: read -r label bin gpu <<<"$m"
    mkdir -p "$WORK/$label"
    taskset -c "$CORES" "$bin" mount "$data" "$WORK/$label" -f --view "$view" --gpu "$gpu" \
      --gpu-mem "$GPU_MEM" ${MOUNT_ARGS:-} >"$OUT/$label-$1.log" 2>&1 &
    pids+=($!) mounts+=("$WORK/$label") args+=(--prepfs "$label" "$WORK/$label" $!)
  done
  for mnt in "${mounts[@]}"; do
    for _ in $(seq 200); do [ -e "$mnt/.prepfs/stats.json" ] && break; sleep 0.1; done
  done
  for mnt in "${mounts[@]}"; do
    [[ $mnt == */prepfs-cpu ]] && continue
    "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1]))["gpu"]; print("gpu document:", d); assert d["available"], d["reason"]' \
      "$mnt/.prepfs/stats.json" 2>&1 | tee -a "$OUT/report.md" || rc=1
  done
  [ $rc = 0 ] && { timeout "${BENCH_TIMEOUT:-600}" taskset -c "$CORES" "$PY" benches/gpu/dataloader.py \
    --images "$data" "${args[@]}" --workers "$WORKERS" --out "$OUT/bench-$1.json" 2>&1 \
    | tee -a "$OUT/report.md" || rc=1; }
  for mnt in "${mounts[@]}"; do
    cp "$mnt/.prepfs/stats.json" "$OUT/stats-$(basename "$mnt")-$1.json"
    "$PREPFS" umount "$mnt"
  done
  wait "${pids[@]}" || true
  return $rc
}
if [ "${BENCH_BUSY:-1}" = 1 ]; then step "benchmark, busy GPU" bench busy; fi
kill $busy 2>/dev/null || true
wait $busy 2>/dev/null || true
step "benchmark, idle GPU" bench idle

say "steps (targets: prepfs-gpu >= 7000 images/s; prepfs CPU per image <= 25% of prepfs-cpu's)"
printf '%s\n' "${results[@]}" | tee -a "$OUT/report.md"
! printf '%s\n' "${results[@]}" | grep -q ^FAIL
