# Sourced by every guest /init: mounts the kernel's file systems, loads the nvme and vfio
# modules, waits for the first namespace's generic device, and sets BDF to the controller's
# PCI address.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "GUEST init at $(cut -d' ' -f1 /proc/uptime)s, kernel $(uname -r)"
# Keep the pinned DMA arena small in a 1 GiB guest.
export KURA_POOL_MIB=32
# io_timeout: under emulation an interrupt is now and then late or lost; the kernel then finds the
# completion when the request times out, so a short timeout bounds that stall at 5 s, not 30.
while read -r ko; do
  case "$ko" in
    */nvme-core.ko*) insmod "$ko" io_timeout=5 ;;
    *vfio_iommu_type1*) insmod "$ko" allow_unsafe_interrupts=1 ;;
    *) insmod "$ko" ;;
  esac 2>&1 | sed 's/^/  insmod: /'
done < /modules.list
for i in $(seq 1 100); do [ -e /dev/ng0n1 ] && break; sleep 0.1; done
echo "GUEST modules loaded at $(cut -d' ' -f1 /proc/uptime)s; $(ls /dev/ng* /dev/nvme* 2>&1 | tr '\n' ' ')"
BDF=
for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = 0x010802 ] && BDF=$(basename $d); done
