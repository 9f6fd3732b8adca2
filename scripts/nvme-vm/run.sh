#!/bin/bash
# Boots an NVMe guest under QEMU's software emulation (KVM guests hang on these hosts): q35 with
# an emulated Intel IOMMU (48-bit addresses, so user-space virtual addresses can be I/O
# addresses) and an emulated NVMe controller with two namespaces on fresh images: disk.img
# (64 MiB, the device-interface tests and the benchmark) and fs.img (32 MiB, AccelFS).
#   run.sh OUT_DIR INIT_SCRIPT TIMEOUT_SECONDS BINARY...
# INIT_SCRIPT is the guest's /init (init: the tests; init-bench: `kura bench io`; init-nbd: ext4
# on the guest kernel's NBD driver attached to `kura serve`); the binaries go to the guest's /bin.
# KURA_VM_APPEND adds to the kernel command line; KURA_VM_QEMU_ARGS adds arguments to QEMU's
# (split on white space; init-vhost: shared guest RAM and a vhost-user-blk disk).
# KURA_VM_ACCEL (default tcg) picks QEMU's accelerator (kvm adds -cpu host, on a host where KVM
# works); KURA_VM_KERNEL with KURA_VM_INITRD boots a kernel and initramfs prepared elsewhere (by
# this script on another machine: OUT_DIR/initramfs.cpio.gz), for a host without the kernel,
# busybox and modules, so nothing is built and BINARY... are not used.
# Leaves OUT_DIR/console.log and the images; exits with QEMU's status (124 on timeout), or 77
# with the reason in OUT_DIR/skipped where QEMU, a kernel, busybox-static or cpio is missing.
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
if [ -n "${KURA_VM_KERNEL:-}" ]; then
  [ -r "$KURA_VM_KERNEL" ] && [ -r "${KURA_VM_INITRD:-}" ] ||
    skip "KURA_VM_KERNEL needs a readable KURA_VM_INITRD (and the kernel readable)"
fi
for tool in qemu-system-x86_64 cpio gzip modprobe; do
  [ -n "${KURA_VM_KERNEL:-}" ] && [ "$tool" != qemu-system-x86_64 ] && continue
  command -v "$tool" > /dev/null || skip "$tool not found (apt: qemu-system-x86 cpio kmod)"
done
[ -n "${KURA_VM_KERNEL:-}" ] || [ -x /bin/busybox ] || skip "/bin/busybox missing (apt: busybox-static)"
# The kernel: the newest installed one, unless INIT_SCRIPT has a `# kura-vm-kernel: cache` line
# (init-ublk: the ublk driver is in Debian's 6.12 kernel, not in the host's), which boots the
# kernel package scripts/setup.sh unpacked into KURA_VM_KDIR (default
# /var/cache/kura/guest-kernel/root) without installing it.
KDIR=
KARGS=
if grep -q '^# kura-vm-kernel: cache$' "$INIT"; then
  # 6.12 panics at boot when its check of the timer interrupt through the remapped IO-APIC
  # times out, which TCG on a busy host makes happen now and then.
  KARGS=no_timer_check
fi
if [ -n "${KURA_VM_KERNEL:-}" ]; then
  KERNEL=$KURA_VM_KERNEL
  INITRD=$KURA_VM_INITRD
else
  if [ -n "$KARGS" ]; then
    KDIR=${KURA_VM_KDIR:-/var/cache/kura/guest-kernel/root}
    KVER=$(ls "$KDIR/lib/modules" 2> /dev/null | sort -V | tail -1)
    [ -n "$KVER" ] && [ -e "$KDIR/boot/vmlinuz-$KVER" ] && [ -e "$KDIR/lib/modules/$KVER/modules.dep" ] ||
      skip "no unpacked guest kernel in $KDIR (run scripts/setup.sh as root: it fetches linux-image-6.12)"
    command -v xz > /dev/null || skip "xz not found (apt: xz-utils)"
  fi
  KVER=${KVER:-$(ls /lib/modules 2> /dev/null | sort -V | tail -1)}
  [ -n "$KVER" ] && [ -e "$KDIR/boot/vmlinuz-$KVER" ] ||
    skip "no /boot/vmlinuz-* with /lib/modules (apt: linux-image-amd64)"
  export KVER KDIR
  KERNEL="$KDIR/boot/vmlinuz-$KVER"
  INITRD="$OUT/initramfs.cpio.gz"
  "$HERE/build-initramfs.sh" "$OUT" "$INIT" "$@" || exit 3
fi
rm -f "$OUT/disk.img"
truncate -s 64M "$OUT/disk.img"
rm -f "$OUT/fs.img"
truncate -s 32M "$OUT/fs.img"
# One virtual CPU unless INIT_SCRIPT asks for more on a `# kura-vm-cpus: N` line (init-nbd: 2, so
# the kernel's NBD driver has two hardware queues for two connections).
CPUS=$(sed -n 's/^# kura-vm-cpus: *\([0-9]*\)$/\1/p' "$INIT")
T0=$(date +%s%N)
ACCEL=${KURA_VM_ACCEL:-tcg}
CPU=
[ "$ACCEL" = tcg ] || CPU="-cpu host"
# no_timer_check for every kernel: Debian's 6.1 panicked at boot the same way as 6.12 above
# ("timer doesn't work through Interrupt-remapped IO-APIC") in `kura bench vm` runs on a loaded host.
# shellcheck disable=SC2086 # CPU and KURA_VM_QEMU_ARGS are lists of arguments.
timeout --kill-after=5 "$LIMIT" qemu-system-x86_64 -accel "$ACCEL" $CPU -m 1024 -smp "${CPUS:-1}" -nographic \
  -machine q35 -device intel-iommu,aw-bits=48 \
  -kernel "$KERNEL" -initrd "$INITRD" \
  -append "console=ttyS0 quiet loglevel=5 intel_iommu=on panic=-1 no_timer_check $KARGS ${KURA_VM_APPEND:-}" \
  -device nvme,id=nvme0,serial=kura0001 \
  -drive "file=$OUT/disk.img,if=none,id=nvm,format=raw" -device nvme-ns,drive=nvm,bus=nvme0,nsid=1 \
  -drive "file=$OUT/fs.img,if=none,id=nvm2,format=raw" -device nvme-ns,drive=nvm2,bus=nvme0,nsid=2 \
  ${KURA_VM_QEMU_ARGS:-} -no-reboot < /dev/null > "$OUT/console.log" 2>&1
RC=$?
echo "qemu rc=$RC, $(( ($(date +%s%N) - T0) / 1000000 )) ms" >> "$OUT/console.log"
exit $RC
