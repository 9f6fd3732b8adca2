#!/bin/bash
# Boots the NVMe guest test under QEMU's software emulation (KVM guests hang on these hosts):
# q35 with an emulated Intel IOMMU (48-bit addresses, so user-space virtual addresses can be
# I/O addresses) and an emulated NVMe controller with two namespaces on fresh images: disk.img
# (64 MiB, the device-interface tests) and fs.img (32 MiB, AccelFS).
#   run.sh OUT_DIR GUEST_BINARY [TIMEOUT_SECONDS]
# Leaves OUT_DIR/console.log and OUT_DIR/disk.img; exits with QEMU's status (124 on timeout).
set -uo pipefail
OUT=$1
BIN=$2
LIMIT=${3:-240}
HERE=$(cd "$(dirname "$0")" && pwd)
KVER=${KVER:-$(ls /lib/modules | sort -V | tail -1)}
mkdir -p "$OUT"
"$HERE/build-initramfs.sh" "$OUT" "$BIN" || exit 3
rm -f "$OUT/disk.img"
truncate -s 64M "$OUT/disk.img"
rm -f "$OUT/fs.img"
truncate -s 32M "$OUT/fs.img"
T0=$(date +%s%N)
timeout --kill-after=5 "$LIMIT" qemu-system-x86_64 -accel tcg -m 1024 -smp 1 -nographic \
  -machine q35 -device intel-iommu,aw-bits=48 \
  -kernel "/boot/vmlinuz-$KVER" -initrd "$OUT/initramfs.cpio.gz" \
  -append "console=ttyS0 quiet intel_iommu=on panic=-1" \
  -device nvme,id=nvme0,serial=kura0001 \
  -drive "file=$OUT/disk.img,if=none,id=nvm,format=raw" -device nvme-ns,drive=nvm,bus=nvme0,nsid=1 \
  -drive "file=$OUT/fs.img,if=none,id=nvm2,format=raw" -device nvme-ns,drive=nvm2,bus=nvme0,nsid=2 \
  -no-reboot < /dev/null > "$OUT/console.log" 2>&1
RC=$?
echo "qemu rc=$RC, $(( ($(date +%s%N) - T0) / 1000000 )) ms" >> "$OUT/console.log"
exit $RC
