#!/usr/bin/env bash
# The README's first command: checks what the build needs (installing it with apt-get as root,
# otherwise naming it and the command that installs it), then builds prepfs and runs its demo.
# Arguments go to `prepfs demo` (e.g. --help).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/system-packages.sh

say() { printf 'demo.sh: %s\n' "$*" >&2; }
command -v cargo >/dev/null || { say "needs a Rust toolchain: install it from https://rustup.rs"; exit 1; }
[ -e /dev/fuse ] || { say "/dev/fuse is missing: load the fuse module (modprobe fuse)"; exit 1; }
needs=("${BUILD_PACKAGES[@]}")
# As root the mount is a mount(2) call; a normal user mounts through fusermount3.
[ "$(id -u)" = 0 ] || needs+=(fuse3:fusermount3)
ensure_packages demo.sh "${needs[@]}" || exit 1
exec cargo run --release --locked -- demo "$@"
