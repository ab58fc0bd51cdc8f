#!/usr/bin/env bash
# The whole test suite, from a fresh machine. Everything it needs is installed or checked first,
# completely, before any test runs (tests never install anything):
#   1. system packages (scripts/system-packages.sh): what the build needs (a C compiler, make,
#      cmake and nasm: libjpeg-turbo, the views' JPEG decoder, is compiled from source with its
#      SIMD code), fuse3 (fusermount3), e2fsprogs and mount (loop-device ext4 images),
#      util-linux's flock and python3-venv, and what the Redis Cluster tests need (redis-server,
#      redis-tools' redis-cli, iproute2's ip and tc, util-linux's nsenter);
#   2. the Python environment of the client tests (python/ensure-env: pinned requirements.lock,
#      rebuilt when half made; $PREPFS_VENV, default ~/.cache/prepfs/venv);
# then every test of the default build (unit tests, real-mount tests of the binary, PyTorch/TF
# clients, examples), the epochs benchmark's quick mode (real PyTorch on throttled slow storage;
# asserts misses and that every views pipeline delivers every image, not timing; its DALI
# pipelines are left out, so DALI is installed only by the full benchmark), the scheduler's
# trainer tests (`--features train`: PPO, the simulator, calibration, online learning), and the
# GPU backend's build with its NVRTC kernel compile (no GPU needed).
# Arguments go to `cargo test` (a test name filter); with arguments only that runs.
# PREPFS_FRESH_VENV=1 builds the Python environment afresh in a temporary directory and removes
# it at exit (CI does this on every submission, to prove the install path).
set -euo pipefail
cd "$(dirname "$0")"

say() { printf 'test.sh: %s\n' "$*" >&2; }
started=$SECONDS

command -v cargo >/dev/null || { say "needs a Rust toolchain (https://rustup.rs)"; exit 1; }
[ -e /dev/fuse ] || { say "/dev/fuse is missing: load the fuse module (modprobe fuse)"; exit 1; }
[ "$(id -u)" = 0 ] || { say "the mount tests run as root (they also test a normal user via setpriv)"; exit 1; }

# 1. System packages (scripts/system-packages.sh: the build's, as for demo.sh, and the tests').
source scripts/system-packages.sh
# fusermount3 is how normal users mount (tested); mkfs.ext4 and losetup make slow-disk images;
# the cluster tests run a real Redis Cluster in network namespaces.
ensure_packages test.sh "${BUILD_PACKAGES[@]}" fuse3:fusermount3 \
  e2fsprogs:mkfs.ext4 mount:losetup util-linux:flock python3-venv:has_python_venv \
  "${CLUSTER_TEST_PACKAGES[@]}" || exit 1
# Without udev (containers), /dev/fuse keeps mode 0600; distributions make it 0666 through the
# fuse3 udev rule, which is what normal-user mounts rely on.
if [ "$(stat -c %a /dev/fuse)" != 666 ]; then
  say "giving /dev/fuse the standard mode 0666 (as the fuse3 udev rule does)"
  chmod 0666 /dev/fuse
fi

# 2. The Python environment, once, before any test binary can ask for it.
if [ "${PREPFS_FRESH_VENV:-0}" = 1 ]; then
  fresh=$(mktemp -d "${TMPDIR:-/tmp}/prepfs-venv.XXXXXX")
  trap 'rm -rf "$fresh"' EXIT
  export PREPFS_VENV="$fresh/venv"
  say "a fresh Python environment in $PREPFS_VENV (removed at exit)"
fi
export PREPFS_VENV="${PREPFS_VENV:-$HOME/.cache/prepfs/venv}"
python/ensure-env >/dev/null
say "set-up done after $((SECONDS - started)) s"

# 3. The tests.
cargo test --locked "$@"
if [ $# -eq 0 ]; then
  # The benchmark harness in the test profile: the quick mode asserts misses, not timing, so it
  # needs no release build of its own (one compile of the dependencies for the whole suite).
  say "epochs benchmark, quick mode"
  cargo test --locked --bench epochs -- --quick
  # The scale benchmark's quick mode: 2,000 files listed and read twice through a mount, every
  # open planned or counted as dropped (no timing).
  say "scale benchmark, quick mode"
  cargo test --locked --bench scale -- --quick
  # The trainer is a cargo feature the default build (tested above, as users install it) leaves
  # out; its tests are the scheduler's unit tests with it. This compiles burn and the few
  # dependencies whose features burn widens, not the whole tree again.
  say "scheduler trainer feature: PPO, simulator, calibration and online learning tests"
  cargo test --locked --features train --lib scheduler
  # The GPU backend (--features cuda) builds without CUDA anywhere, and its kernel compiles
  # through NVRTC, which the venv's pip CUDA libraries provide (no GPU needed): required here,
  # so a missing NVRTC fails instead of skipping. The GPU-only checks are benches/gpu/check.sh.
  say "GPU backend feature: build, and compile the kernel with the venv's NVRTC"
  PREPFS_CUDA_PYTHON="$PREPFS_VENV" PREPFS_REQUIRE_NVRTC=1 \
    cargo test --locked --features cuda --lib --test gpu view::gpu
fi
say "passed in $((SECONDS - started)) s"
