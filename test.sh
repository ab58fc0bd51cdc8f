#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs or checks what it needs, then runs
# every test (unit tests of the core and real-mount tests of the binary) and the epochs
# benchmark's quick mode (real PyTorch on throttled slow storage; asserts misses, not timing).
# Arguments go to `cargo test` (a test name filter); with arguments the quick mode is skipped.
set -euo pipefail
cd "$(dirname "$0")"

say() { printf 'test.sh: %s\n' "$*" >&2; }

command -v cargo >/dev/null || { say "needs a Rust toolchain (https://rustup.rs)"; exit 1; }
[ -e /dev/fuse ] || { say "/dev/fuse is missing: load the fuse module (modprobe fuse)"; exit 1; }
[ "$(id -u)" = 0 ] || { say "the mount tests run as root (they also test a normal user via setpriv)"; exit 1; }

# fusermount3 (package fuse3) is how normal users mount; the tests cover that path.
if ! command -v fusermount3 >/dev/null; then
  say "installing fuse3 (fusermount3)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq fuse3 >/dev/null
fi
# Without udev (containers), /dev/fuse keeps mode 0600; distributions make it 0666 through the
# fuse3 udev rule, which is what normal-user mounts rely on.
if [ "$(stat -c %a /dev/fuse)" != 666 ]; then
  say "giving /dev/fuse the standard mode 0666 (as the fuse3 udev rule does)"
  chmod 0666 /dev/fuse
fi

# The epochs harness: ext4 images on loop devices, and a Python for the cached client venv.
need_pkgs=()
command -v mkfs.ext4 >/dev/null || need_pkgs+=(e2fsprogs)
command -v losetup >/dev/null || need_pkgs+=(mount)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  say "installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

cargo test --locked "$@"
if [ $# -eq 0 ]; then
  say "epochs benchmark, quick mode (first run installs torch into ~/.cache/prepfs/venv)"
  cargo bench --locked --bench epochs -- --quick
  # The GPU backend (--features cuda) builds without CUDA anywhere, and its kernel compiles
  # through NVRTC, which the venv's pip CUDA libraries provide (no GPU needed): required here,
  # so a missing NVRTC fails instead of skipping. The GPU-only checks are benches/gpu/check.sh.
  say "GPU backend feature: build, and compile the kernel with the venv's NVRTC"
  PREPFS_CUDA_PYTHON="$HOME/.cache/prepfs/venv" PREPFS_REQUIRE_NVRTC=1 \
    cargo test --locked --features cuda --lib --test gpu view::gpu
fi
