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
for tool in qemu-system-x86_64 cpio gzip modprobe; do
  command -v "$tool" > /dev/null || skip "$tool not found (apt: qemu-system-x86 cpio kmod)"
done
[ -x /bin/busybox ] || skip "/bin/busybox missing (apt: busybox-static)"
# The kernel: the newest installed one, unless INIT_SCRIPT has a `# kura-vm-kernel: cache` line
# (init-ublk: the ublk driver is in Debian's 6.12 kernel, not in the host's), which boots the
# kernel package scripts/setup.sh unpacked into KURA_VM_KDIR (default
# /var/cache/kura/guest-kernel/root) without installing it.
KDIR=
KARGS=
if grep -q '^# kura-vm-kernel: cache$' "$INIT"; then
  KDIR=${KURA_VM_KDIR:-/var/cache/kura/guest-kernel/root}
  KVER=$(ls "$KDIR/lib/modules" 2> /dev/null | sort -V | tail -1)
  [ -n "$KVER" ] && [ -e "$KDIR/boot/vmlinuz-$KVER" ] && [ -e "$KDIR/lib/modules/$KVER/modules.dep" ] ||
    skip "no unpacked guest kernel in $KDIR (run scripts/setup.sh as root: it fetches linux-image-6.12)"
  command -v xz > /dev/null || skip "xz not found (apt: xz-utils)"
  # 6.12 panics at boot when its check of the timer interrupt through the remapped IO-APIC
  # times out, which TCG on a busy host makes happen now and then.
  KARGS=no_timer_check
fi
KVER=${KVER:-$(ls /lib/modules 2> /dev/null | sort -V | tail -1)}
[ -n "$KVER" ] && [ -e "$KDIR/boot/vmlinuz-$KVER" ] ||
  skip "no /boot/vmlinuz-* with /lib/modules (apt: linux-image-amd64)"
export KVER KDIR
"$HERE/build-initramfs.sh" "$OUT" "$INIT" "$@" || exit 3
rm -f "$OUT/disk.img"
truncate -s 64M "$OUT/disk.img"
rm -f "$OUT/fs.img"
truncate -s 32M "$OUT/fs.img"
# One virtual CPU unless INIT_SCRIPT asks for more on a `# kura-vm-cpus: N` line (init-nbd: 2, so
# the kernel's NBD driver has two hardware queues for two connections).
CPUS=$(sed -n 's/^# kura-vm-cpus: *\([0-9]*\)$/\1/p' "$INIT")
T0=$(date +%s%N)
# shellcheck disable=SC2086 # KURA_VM_QEMU_ARGS is a list of arguments.
timeout --kill-after=5 "$LIMIT" qemu-system-x86_64 -accel tcg -m 1024 -smp "${CPUS:-1}" -nographic \
  -machine q35 -device intel-iommu,aw-bits=48 \
  -kernel "$KDIR/boot/vmlinuz-$KVER" -initrd "$OUT/initramfs.cpio.gz" \
  -append "console=ttyS0 quiet loglevel=5 intel_iommu=on panic=-1 $KARGS ${KURA_VM_APPEND:-}" \
  -device nvme,id=nvme0,serial=kura0001 \
  -drive "file=$OUT/disk.img,if=none,id=nvm,format=raw" -device nvme-ns,drive=nvm,bus=nvme0,nsid=1 \
  -drive "file=$OUT/fs.img,if=none,id=nvm2,format=raw" -device nvme-ns,drive=nvm2,bus=nvme0,nsid=2 \
  ${KURA_VM_QEMU_ARGS:-} -no-reboot < /dev/null > "$OUT/console.log" 2>&1
RC=$?
echo "qemu rc=$RC, $(( ($(date +%s%N) - T0) / 1000000 )) ms" >> "$OUT/console.log"
exit $RC
