#!/bin/bash
# Packs the NVMe guest test initramfs: busybox-static, the kernel modules of the nvme and
# vfio-pci stacks (in dependency order, listed in /modules.list), the guest test program with
# the shared libraries it links, and ./init.
#   build-initramfs.sh OUT_DIR GUEST_BINARY
set -euo pipefail
OUT=$1
BIN=$2
HERE=$(cd "$(dirname "$0")" && pwd)
KVER=${KVER:-$(ls /lib/modules | sort -V | tail -1)}
R="$OUT/rootfs"
rm -rf "$R"
mkdir -p "$R"/{bin,sbin,proc,sys,dev,tmp,etc}
cp /bin/busybox "$R/bin/busybox"
cp "$BIN" "$R/bin/kura-nvme-guest"
for lib in $(ldd "$BIN" | grep -oE '/[^ ]+\.so[^ ]*' | sort -u); do
  mkdir -p "$R$(dirname "$lib")"
  cp -L "$lib" "$R$lib"
done
# Dependency order: every module after the ones it needs, each once.
: > "$R/modules.list"
for m in nvme vfio_iommu_type1 vfio-pci; do
  modprobe -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  mkdir -p "$R$(dirname "$ko")"
  cp "$ko" "$R$ko"
  echo "$ko" >> "$R/modules.list"
done
install -m 755 "$HERE/init" "$R/init"
(cd "$R" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$OUT/initramfs.cpio.gz"
echo "initramfs: $OUT/initramfs.cpio.gz ($(du -h "$OUT/initramfs.cpio.gz" | cut -f1)), kernel /boot/vmlinuz-$KVER"
