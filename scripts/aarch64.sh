#!/usr/bin/env bash
# kura on aarch64 (issue 21): builds the kura CLI and kura-nvme-guest for
# aarch64-unknown-linux-gnu (which compiles every library of the workspace but kura-testkit, and
# both its programs), builds and runs a chosen set of test binaries under qemu-aarch64 (user-mode
# emulation), then boots the aarch64 guest (qemu-system-aarch64, scripts/nvme-vm/run-aarch64.sh)
# with that kura-nvme-guest: crates/nvme-guest/tests/vm_aarch64.rs, run natively with --ignored.
# Called by scripts/test.sh after the native tests; runs alone too. Extra arguments go to the
# `cargo test` under qemu-aarch64.
#
# - Its own target directory (target/aarch64), so the native build is never rebuilt for it.
# - Linker, C compiler and runner are set here by environment variables, not in a
#   .cargo/config, so native builds stay exactly as they are; they are passed to the cross
#   cargo commands only (the guest test is a native build in target/).
# - No debug info for the aarch64 build (CARGO_PROFILE_DEV_DEBUG=0): less for the compiler and
#   linker to write, and nobody debugs these binaries here.
# - The crates with C libraries build without them (KURA_NO_LEVELDB, KURA_NO_OPENSSL,
#   KURA_NO_RBD): Debian's arm64 LevelDB, OpenSSL and librbd are not installed, so kura-kv,
#   kura-nbd (TLS-PSK) and kura-rbd are built in their without-library mode for aarch64.
# - Test binaries run with KURA_EMULATOR=qemu-aarch64: a test that skips there is logged under a
#   prefixed capability (qemu-aarch64:io_uring), which .ci/allowed-skips may list, while the
#   plain capability stays a failure on the native run (see crates/testkit).
#
# Needs: rustup target aarch64-unknown-linux-gnu, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross
# and qemu-user-static (scripts/setup.sh installs them). Without them it logs a skip and exits 0
# outside CI, and fails under CI=true.
set -uo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
QEMU=qemu-aarch64-static
SYSROOT=/usr/aarch64-linux-gnu

missing=()
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
command -v "$QEMU" >/dev/null || missing+=(qemu-user-static)
[ -e "$SYSROOT/lib/ld-linux-aarch64.so.1" ] || missing+=(libc6-dev-arm64-cross)
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$TARGET"; then
  missing+=("rustup target $TARGET")
fi
if [ ${#missing[@]} -gt 0 ]; then
  why="missing ${missing[*]} (scripts/setup.sh installs them as root)"
  echo "aarch64: $why" >&2
  if [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; then
    exit 1
  fi
  log="${KURA_SKIP_LOG:-$PWD/target/kura-skips.log}"
  mkdir -p "$(dirname "$log")"
  printf 'scripts/aarch64.sh\taarch64-cross\t%s\n' "$why" >>"$log"
  exit 0
fi

AARCH64=(
  CARGO_TARGET_DIR="$PWD/target/aarch64"
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$QEMU -L $SYSROOT"
  CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
  CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
  AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
  KURA_NO_LEVELDB=1 KURA_NO_OPENSSL=1 KURA_NO_RBD=1
  KURA_EMULATOR=qemu-aarch64
  CARGO_PROFILE_DEV_DEBUG=0
)

status=0
start=$SECONDS
# The two programs: the CLI depends on every library crate of the workspace but kura-testkit
# (built for the tests below), so this compiles all of it for aarch64 and links both binaries
# the guest runs. (`cargo build --workspace --target` passes too, with the test targets: more
# code generation than this step's share of CI's time.)
echo "== aarch64: cargo build -p kura -p kura-nvme-guest --target $TARGET"
env "${AARCH64[@]}" cargo build -p kura -p kura-nvme-guest --target "$TARGET" || status=1
echo "aarch64: build took $((SECONDS - start)) s"

# The test binaries that run under qemu-aarch64: the engine (backends, redirect channel, buffer
# pool, lock-free stress), the NVMe driver against its simulated controller (queue-pair stress
# with a concurrent device thread), the skip rules, CRUSH (its portable batch mapper, where
# x86-64 takes the AVX2 one) and AccelFS's on-disk codecs and file system on memory devices.
# Tests that start other programs built for aarch64 (the kura CLI) are left out: without
# binfmt_misc the kernel cannot exec them.
start=$SECONDS
echo "== aarch64: cargo test under $QEMU"
for selection in \
  "-p kura-engine --lib --test lockfree_stress --test redirect --test conformance" \
  "-p kura-nvme --lib --test sim" \
  "-p kura-testkit --lib" \
  "-p kura-crush -p kura-accelfs --lib"; do
  # shellcheck disable=SC2086 # the selection is a list of words
  env "${AARCH64[@]}" cargo test --target "$TARGET" --no-fail-fast $selection "$@" || status=1
done
echo "aarch64: tests under $QEMU took $((SECONDS - start)) s"

# The stack in an aarch64 guest with the kura-nvme-guest just built: the test itself is a native
# program (it boots QEMU and reads the images afterwards); it skips, visibly, where
# qemu-system-aarch64 or the arm64 kernel is missing.
start=$SECONDS
GUEST_BIN="$PWD/target/aarch64/$TARGET/debug/kura-nvme-guest"
echo "== aarch64: guest (cargo test -p kura-nvme-guest --test vm_aarch64 -- --ignored)"
if [ -x "$GUEST_BIN" ]; then
  KURA_AARCH64_GUEST_BIN="$GUEST_BIN" cargo test -p kura-nvme-guest --test vm_aarch64 \
    -- --ignored --nocapture || status=1
else
  echo "aarch64: no $GUEST_BIN (the build failed), so no guest" >&2
  status=1
fi
echo "aarch64: guest took $((SECONDS - start)) s"
exit $status
