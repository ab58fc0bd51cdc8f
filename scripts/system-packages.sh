# The system packages prepfs's scripts need, checked in one place (sourced by demo.sh and test.sh).
#
# Each need is PACKAGE:PROBE, a Debian package and what shows it is installed: a command on PATH,
# or one of the has_* functions below. `ensure_packages WHO NEED...` installs the missing ones
# with apt-get when run as root, and otherwise stops with one line that names them and the
# command that installs them, so that a missing tool never ends in a build script's panic
# (turbojpeg-sys runs cmake, and cmake needs make and a C compiler; its SIMD code needs nasm).

# What `cargo build` needs beyond a Rust toolchain: libjpeg-turbo, the views' JPEG decoder, is
# compiled from the source turbojpeg-sys vendors, with its SIMD code.
BUILD_PACKAGES=(gcc:cc make:make cmake:cmake nasm:nasm)

# What the Redis Cluster tests need (tests/common/cluster.rs): redis-server and redis-cli for a real
# cluster, ip and tc (iproute2) for its network namespaces, bridge, veths and link shaping, and
# nsenter (util-linux) to run a command in one node's network namespace by hand. Debian's
# redis-server package may start a system redis on 127.0.0.1:6379; the tests neither use nor
# collide with it (their nodes listen on 10.x addresses of their own namespaces).
CLUSTER_TEST_PACKAGES=(redis-server:redis-server redis-tools:redis-cli iproute2:ip util-linux:nsenter)

# Python's venv with pip (python3-venv): the client tests' environment is built with it.
has_python_venv() { python3 -c 'import venv, ensurepip' 2>/dev/null; }

# ensure_packages WHO PACKAGE:PROBE...: installs (root) or names (others) the missing packages.
ensure_packages() {
  local who=$1 need pkg probe missing=()
  shift
  for need in "$@"; do
    pkg=${need%%:*} probe=${need#*:}
    if [ "$(type -t "$probe")" = function ]; then
      "$probe" || missing+=("$pkg")
    else
      command -v "$probe" >/dev/null || missing+=("$pkg")
    fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    printf '%s: installing %s\n' "$who" "${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null &&
      return 0
    printf '%s: could not install %s with apt-get (see above)\n' "$who" "${missing[*]}" >&2
    return 1
  fi
  local install="install with: apt-get install ${missing[*]}"
  [ "$(id -u)" = 0 ] || install="install with: sudo apt-get install ${missing[*]}"
  command -v apt-get >/dev/null || install="install them with your package manager"
  printf '%s: missing %s; %s\n' "$who" "${missing[*]}" "$install" >&2
  return 1
}
