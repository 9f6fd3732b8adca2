#!/bin/bash
# Packs an NVMe guest initramfs: busybox-static, the kernel modules of the nvme and vfio-pci
# stacks and any INIT_SCRIPT names (in dependency order, listed in /modules.list), the given
# programs in /bin (stripped, which keeps a debug build's binary small enough to unpack quickly
# under emulation) with the shared libraries they link, guest-setup.sh (which every init
# sources) and INIT_SCRIPT as /init.
#   build-initramfs.sh OUT_DIR INIT_SCRIPT BINARY...
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$1
INIT=$2
shift 2
KVER=${KVER:-$(ls /lib/modules | sort -V | tail -1)}
# KDIR (from run.sh): the root an unpacked kernel package's /boot and /lib/modules are under;
# empty for the installed kernel. Its xz-compressed modules are unpacked (busybox insmod loads
# plain ones) and go to the guest's /lib/modules.
KDIR=${KDIR:-}
# A guest of another architecture (run-aarch64.sh) sets KURA_VM_BUSYBOX (its busybox-static),
# KURA_VM_STRIP (its binutils' strip) and KURA_VM_LIBDIR: ldd cannot run its programs, so the
# shared libraries their ELF headers name (and the loader) are copied from that directory into
# the guest's /lib.
BUSYBOX=${KURA_VM_BUSYBOX:-/bin/busybox}
STRIP=${KURA_VM_STRIP:-strip}
LIBDIR=${KURA_VM_LIBDIR:-}
R="$OUT/rootfs"
rm -rf "$R"
mkdir -p "$R"/{bin,sbin,proc,sys,dev,tmp,etc}
cp "$BUSYBOX" "$R/bin/busybox"
for BIN in "$@"; do
  DEST="$R/bin/$(basename "$BIN")"
  if command -v "$STRIP" > /dev/null; then
    "$STRIP" -o "$DEST" "$BIN"
  else
    cp "$BIN" "$DEST"
  fi
  if [ -n "$LIBDIR" ]; then
    mkdir -p "$R/lib"
    for lib in $(readelf -d "$BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p') \
      $(readelf -l "$BIN" | sed -n 's/.*interpreter: .*\/\([^/]*\)\]/\1/p'); do
      cp -L "$LIBDIR/$lib" "$R/lib/$lib"
    done
    continue
  fi
  for lib in $(ldd "$BIN" | grep -oE '/[^ ]+\.so[^ ]*' | sort -u); do
    mkdir -p "$R$(dirname "$lib")"
    cp -L "$lib" "$R$lib"
  done
done
# Dependency order: every module after the ones it needs, each once. An init script may name more
# modules on a `# kura-vm-modules: NAME...` line (init-nbd: nbd and ext4).
EXTRA_MODULES=$(sed -n 's/^# kura-vm-modules: *//p' "$INIT")
: > "$R/modules.list"
for m in nvme vfio_iommu_type1 vfio-pci $EXTRA_MODULES; do
  modprobe ${KDIR:+-d "$KDIR"} -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  dest=${ko#"$KDIR"}
  dest=${dest%.xz}
  mkdir -p "$R$(dirname "$dest")"
  case "$ko" in
    *.xz) xz -dc "$ko" > "$R$dest" ;;
    *) cp "$ko" "$R$dest" ;;
  esac
  echo "$dest" >> "$R/modules.list"
done
install -m 644 "$HERE/guest-setup.sh" "$R/guest-setup.sh"
install -m 755 "$INIT" "$R/init"
(cd "$R" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$OUT/initramfs.cpio.gz"
echo "initramfs: $OUT/initramfs.cpio.gz ($(du -h "$OUT/initramfs.cpio.gz" | cut -f1)), kernel $KDIR/boot/vmlinuz-$KVER"
