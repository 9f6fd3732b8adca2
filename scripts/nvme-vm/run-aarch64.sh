#!/bin/bash
# The aarch64 variant of run.sh: boots an arm64 guest under QEMU's software emulation (TCG) on
# the virt machine (GICv3, an emulated SMMUv3 in front of the PCI bus, so vfio-pci has an IOMMU
# to program) with Debian's arm64 kernel, and the same emulated NVMe controller with two
# namespaces on fresh images: disk.img (64 MiB) and fs.img (32 MiB).
#   run-aarch64.sh OUT_DIR INIT_SCRIPT TIMEOUT_SECONDS BINARY...
# The binaries must be built for aarch64-unknown-linux-gnu (scripts/aarch64.sh builds kura and
# kura-nvme-guest); their shared libraries come from the cross libc (libc6-dev-arm64-cross).
# The kernel and busybox are the arm64 packages scripts/setup.sh unpacked into KURA_VM_ARM64_ROOT
# (default /var/cache/kura/guest-kernel-arm64/root); no firmware: QEMU loads the kernel directly.
# KURA_VM_APPEND adds to the kernel command line; KURA_VM_QEMU_ARGS to QEMU's; KURA_VM_ACCEL
# (default tcg) picks QEMU's accelerator.
# Leaves OUT_DIR/console.log and the images; exits with QEMU's status (124 on timeout), or 77
# with the reason in OUT_DIR/skipped where QEMU, the arm64 kernel, busybox or a tool is missing.
set -uo pipefail
OUT=$1
INIT=$2
LIMIT=$3
shift 3
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
skip() {
  echo "$1" > "$OUT/skipped"
  exit 77
}
for tool in qemu-system-aarch64 cpio gzip modprobe readelf; do
  command -v "$tool" > /dev/null || skip "$tool not found (apt: qemu-system-arm cpio kmod binutils)"
done
command -v aarch64-linux-gnu-strip > /dev/null || skip "aarch64-linux-gnu-strip not found (apt: gcc-aarch64-linux-gnu)"
LIBDIR=/usr/aarch64-linux-gnu/lib
[ -e "$LIBDIR/ld-linux-aarch64.so.1" ] || skip "no $LIBDIR/ld-linux-aarch64.so.1 (apt: libc6-dev-arm64-cross)"
KDIR=${KURA_VM_ARM64_ROOT:-/var/cache/kura/guest-kernel-arm64/root}
KVER=$(ls "$KDIR/lib/modules" 2> /dev/null | sort -V | tail -1)
[ -n "$KVER" ] && [ -e "$KDIR/boot/vmlinuz-$KVER" ] && [ -e "$KDIR/lib/modules/$KVER/modules.dep" ] &&
  [ -x "$KDIR/bin/busybox" ] ||
  skip "no unpacked arm64 kernel and busybox in $KDIR (run scripts/setup.sh as root: it fetches linux-image-arm64 and busybox-static:arm64)"
for BIN in "$@"; do
  readelf -h "$BIN" 2> /dev/null | grep -q 'AArch64' || {
    echo "$BIN is not an aarch64 program" > "$OUT/console.log"
    exit 3
  }
done
export KVER KDIR
KURA_VM_BUSYBOX="$KDIR/bin/busybox" KURA_VM_STRIP=aarch64-linux-gnu-strip KURA_VM_LIBDIR=$LIBDIR \
  "$HERE/build-initramfs.sh" "$OUT" "$INIT" "$@" || exit 3
rm -f "$OUT/disk.img"
truncate -s 64M "$OUT/disk.img"
rm -f "$OUT/fs.img"
truncate -s 32M "$OUT/fs.img"
CPUS=$(sed -n 's/^# kura-vm-cpus: *\([0-9]*\)$/\1/p' "$INIT")
# KURA_VM_ACCEL=kvm on an arm64 host with /dev/kvm runs the guest's CPU natively (-cpu host).
# Under TCG, cortex-a57 rather than max: TCG emulates max's pointer authentication and SVE
# slowly, and neither matters here.
ACCEL=${KURA_VM_ACCEL:-tcg}
CPU=cortex-a57
[ "$ACCEL" = tcg ] || CPU=host
T0=$(date +%s%N)
# shellcheck disable=SC2086 # KURA_VM_QEMU_ARGS is a list of arguments.
timeout --kill-after=5 "$LIMIT" qemu-system-aarch64 -accel "$ACCEL" -cpu "$CPU" -m 1024 -smp "${CPUS:-1}" \
  -nographic -machine virt,gic-version=3,iommu=smmuv3 \
  -kernel "$KDIR/boot/vmlinuz-$KVER" -initrd "$OUT/initramfs.cpio.gz" \
  -append "console=ttyAMA0 quiet loglevel=5 panic=-1 ${KURA_VM_APPEND:-}" \
  -device nvme,id=nvme0,serial=kura0001 \
  -drive "file=$OUT/disk.img,if=none,id=nvm,format=raw" -device nvme-ns,drive=nvm,bus=nvme0,nsid=1 \
  -drive "file=$OUT/fs.img,if=none,id=nvm2,format=raw" -device nvme-ns,drive=nvm2,bus=nvme0,nsid=2 \
  ${KURA_VM_QEMU_ARGS:-} -no-reboot < /dev/null > "$OUT/console.log" 2>&1
RC=$?
echo "qemu rc=$RC, $(( ($(date +%s%N) - T0) / 1000000 )) ms" >> "$OUT/console.log"
exit $RC
