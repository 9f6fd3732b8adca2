#!/usr/bin/env bash
# Installs what kura's build and tests use, and says what is still missing. Idempotent: it only
# installs what is absent, so running it again (scripts/test.sh does, every time) is quick.
#
# Debian packages are installed with apt-get when this runs as root on a system that has it;
# otherwise the missing ones are listed with the command that installs them. Python modules go
# in with `python3 -m pip`, the rustfmt and clippy components with rustup.
#
# Exits 1 when something the workspace needs to *build* is missing (kura-kv compiles a C++
# bridge against Google LevelDB); anything else missing only makes the tests that need it skip
# (visibly: scripts/test.sh lists skips at the end, and CI=true fails them, see
# .ci/allowed-skips).
set -uo pipefail
cd "$(dirname "$0")/.."

# Needed to build the workspace: libleveldb-dev (kura-kv's engine) and g++ (its bridge).
BUILD_PACKAGES=(libleveldb-dev g++)
# Needed by tests. fio: the peer of `kura bench io`; util-linux: losetup for the loop-device
# tests; fuse3: fusermount3, which `kura mount` (fuser) and nbdfuse use; e2fsprogs: mkfs.ext4
# and e2fsck for ext4 on a kura export. libnbd-bin (nbdinfo, nbdcopy, nbdfuse), qemu-utils,
# nbdkit: real NBD clients and peer servers for kura-nbd's tests; openssl: test certificates
# for NBD over TLS. minimap2, samtools: the genome pipeline's peer mapper and SAM checker;
# bwa, bowtie2: the other peer mappers of `kura bench genome` (and its --matrix);
# ragout-examples: the real E. coli MG1655 genome; spades: its test data, a real Illumina
# read pair of MG1655 (`kura bench genome --real`). qemu-system-x86, linux-image-amd64,
# busybox-static, cpio, kmod, xz-utils: the guest with an emulated NVMe controller that kura-nvme's
# driver is tested against (crates/nvme-guest). python3-pip: for the Python peers below.
# libssl-dev, pkg-config: kura-nbd links OpenSSL for TLS-PSK (`kura serve --tls-psk`) when
# pkg-config finds it; without them it builds without PSK and the PSK tests skip.
# gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user-static: the aarch64 cross build and
# its tests under qemu-aarch64 (scripts/aarch64.sh, with the rustup target added below).
# qemu-system-arm: qemu-system-aarch64, for the aarch64 guest (scripts/nvme-vm/run-aarch64.sh).
TEST_PACKAGES=(fio util-linux fuse3 e2fsprogs libnbd-bin qemu-utils nbdkit openssl minimap2
  samtools ragout-examples qemu-system-x86 linux-image-amd64 busybox-static cpio kmod gzip
  python3 python3-pip libssl-dev pkg-config attr ceph-base librocksdb-dev liblmdb-dev sqlite3 dbench git
  nbd-client ceph-mon ceph-mgr ceph-osd ceph-common librbd-dev librados-dev qemu-block-extra bwa bowtie2
  iproute2 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static xz-utils qemu-system-arm
  spades)
# Python modules: "module pip-name what-for".
PYTHON_MODULES=(
  "matplotlib matplotlib benchmark plots (scripts/plot_*.py)"
  "plyvel plyvel Google LevelDB from Python, the interoperability peer of kura-kv's tests"
  "pywgsim pywgsim the read simulator that defines the genome accuracy figures"
  "pytest pytest the runner of the kura Python module's tests (crates/pystore)"
)

missing_after=()

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

echo "== setup: Debian packages"
if command -v dpkg-query >/dev/null; then
  want=()
  for p in "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"; do
    installed "$p" || want+=("$p")
  done
  if [ ${#want[@]} -eq 0 ]; then
    echo "all present"
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing: ${want[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get update -qq >/dev/null ||
      ! apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null; then
      echo "apt-get could not install: ${want[*]}" >&2
      exit 1
    fi
  else
    echo "missing: ${want[*]}"
    echo "  install them with: sudo apt-get install --no-install-recommends ${want[*]}"
  fi
  for p in "${BUILD_PACKAGES[@]}"; do
    installed "$p" || missing_after+=("$p")
  done
else
  echo "no dpkg here: install the equivalents of ${BUILD_PACKAGES[*]} (needed to build) and"
  echo "  ${TEST_PACKAGES[*]} (used by tests) with this system's package manager"
fi

echo "== setup: guest kernel with ublk"
# The ublk guest test (scripts/nvme-vm/init-ublk) boots Debian's 6.12 kernel, which builds
# ublk_drv and nbd as modules; it is unpacked into a cache, not installed, so the other guest
# tests keep booting the installed kernel. apt-get download needs the ABI-versioned package
# that linux-image-6.12-amd64 depends on.
GUEST_KERNEL=/var/cache/kura/guest-kernel
if ls "$GUEST_KERNEL"/root/lib/modules/*/modules.dep >/dev/null 2>&1; then
  echo "present: $(ls "$GUEST_KERNEL/root/lib/modules")"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  pkg=$(apt-cache depends linux-image-6.12-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-6\.12[^ ]*-amd64\)$/\1/p' | head -1)
  if [ -n "$pkg" ] && mkdir -p "$GUEST_KERNEL" &&
    (cd "$GUEST_KERNEL" && rm -f ./*.deb && apt-get download -qq "$pkg" 2>/dev/null) &&
    dpkg -x "$GUEST_KERNEL"/*.deb "$GUEST_KERNEL/root" &&
    depmod -b "$GUEST_KERNEL/root" "$(ls "$GUEST_KERNEL/root/lib/modules" | sort -V | tail -1)"; then
    rm -f "$GUEST_KERNEL"/*.deb
    echo "unpacked $pkg into $GUEST_KERNEL/root"
  else
    echo "could not fetch linux-image-6.12 (${pkg:-no candidate}); the ublk guest test will skip" >&2
  fi
else
  echo "missing: as root, scripts/setup.sh unpacks linux-image-6.12-amd64 into $GUEST_KERNEL"
fi

echo "== setup: aarch64 guest kernel and busybox"
# The aarch64 guest (scripts/nvme-vm/run-aarch64.sh) boots Debian's arm64 kernel with an arm64
# busybox-static, both fetched through multiarch (dpkg --add-architecture arm64) and unpacked
# into a cache, not installed.
GUEST_ARM64=/var/cache/kura/guest-kernel-arm64
if ls "$GUEST_ARM64"/root/lib/modules/*/modules.dep >/dev/null 2>&1 && [ -x "$GUEST_ARM64/root/bin/busybox" ]; then
  echo "present: $(ls "$GUEST_ARM64/root/lib/modules")"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  dpkg --print-foreign-architectures | grep -qx arm64 ||
    { dpkg --add-architecture arm64 && apt-get update -qq >/dev/null 2>&1; }
  pkg=$(apt-cache depends linux-image-arm64:arm64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-6[^ ]*-arm64\)\(:arm64\)\?$/\1/p' | head -1)
  if [ -n "$pkg" ] && mkdir -p "$GUEST_ARM64" &&
    (cd "$GUEST_ARM64" && rm -f ./*.deb &&
      apt-get download -qq "$pkg:arm64" busybox-static:arm64 2>/dev/null) &&
    (for deb in "$GUEST_ARM64"/*.deb; do dpkg -x "$deb" "$GUEST_ARM64/root" || exit 1; done) &&
    depmod -b "$GUEST_ARM64/root" "$(ls "$GUEST_ARM64/root/lib/modules" | sort -V | tail -1)"; then
    rm -f "$GUEST_ARM64"/*.deb
    echo "unpacked $pkg and busybox-static:arm64 into $GUEST_ARM64/root"
  else
    echo "could not fetch the arm64 kernel (${pkg:-no candidate}); the aarch64 guest test will skip" >&2
  fi
else
  echo "missing: as root, scripts/setup.sh unpacks linux-image-arm64 and busybox-static:arm64 into $GUEST_ARM64"
fi

echo "== setup: Python modules"
if command -v python3 >/dev/null; then
  for entry in "${PYTHON_MODULES[@]}"; do
    read -r module pip what <<<"$entry"
    if python3 -c "import $module" >/dev/null 2>&1; then
      continue
    fi
    echo "installing $pip: $what"
    # Debian's own python3 refuses pip installs (PEP 668) unless told to.
    python3 -m pip install -q --disable-pip-version-check "$pip" >/dev/null 2>&1 ||
      python3 -m pip install -q --disable-pip-version-check --break-system-packages "$pip" \
        >/dev/null 2>&1 ||
      echo "  could not install $pip (python3 -m pip install $pip): the tests that need it skip"
  done
  echo "done"
else
  echo "python3 is missing: the Python peers' tests skip"
fi

echo "== setup: Rust components"
if command -v rustup >/dev/null; then
  rustup component add rustfmt clippy >/dev/null 2>&1 ||
    echo "rustup could not add rustfmt and clippy"
  rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1 ||
    echo "rustup could not add the aarch64-unknown-linux-gnu target (scripts/aarch64.sh needs it)"
  echo "done"
else
  echo "no rustup: make sure cargo fmt and cargo clippy are installed"
fi

if [ ${#missing_after[@]} -gt 0 ]; then
  echo "setup: the workspace cannot build without: ${missing_after[*]}" >&2
  echo "  install them with: sudo apt-get install --no-install-recommends ${missing_after[*]}" >&2
  exit 1
fi
