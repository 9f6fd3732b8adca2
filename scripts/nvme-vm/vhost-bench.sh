#!/bin/bash
# fio in a TCG guest on kura's vhost-user-blk disk against QEMU's own virtio-blk (aio=io_uring,
# cache=none) and QEMU's NBD client to kura serve's NBD export, each on its own 64 MiB image
# file in WORK (same file system, same size, filled with the same data first). One guest, jobs
# interleaved across the three disks (init-vhost-bench). Prints the BENCH lines and the median
# IOPS per job and disk with the ratios kura/qemu and kura/nbd. Emulated: a relative view only.
#   vhost-bench.sh KURA_BINARY WORK [ROUNDS] [SECONDS]
set -euo pipefail
KURA=$1
WORK=$2
ROUNDS=${3:-2}
SECS=${4:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK"
for img in kura qemu nbd; do
  rm -f "$WORK/$img.img"
  head -c 64M /dev/urandom > "$WORK/$img.img"
done
"$KURA" serve --vhost-user "disk=file:$WORK/kura.img" --socket "$WORK/vhu.sock" \
  --unix "$WORK/nbd.sock" "nbd=file:$WORK/nbd.img" 2> "$WORK/serve.log" &
SERVE=$!
trap 'kill $SERVE 2> /dev/null || true' EXIT
for i in $(seq 1 100); do [ -S "$WORK/vhu.sock" ] && [ -S "$WORK/nbd.sock" ] && break; sleep 0.1; done
export KURA_VM_QEMU_ARGS="-object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem \
 -chardev socket,id=vhu,path=$WORK/vhu.sock -device vhost-user-blk-pci,chardev=vhu,num-queues=2 \
 -drive file=$WORK/qemu.img,format=raw,if=none,id=q,aio=io_uring,cache.direct=on \
 -device virtio-blk-pci,drive=q,serial=qemu,num-queues=2 \
 -drive driver=nbd,server.type=unix,server.path=$WORK/nbd.sock,export=nbd,if=none,id=n,cache.direct=on \
 -device virtio-blk-pci,drive=n,serial=nbd,num-queues=2"
export KURA_VM_APPEND="kura_bench_rounds=$ROUNDS kura_bench_secs=$SECS"
"$HERE/run.sh" "$WORK/vm" "$HERE/init-vhost-bench" 600 /usr/bin/fio || true
kill -TERM $SERVE
wait $SERVE || true
grep -a '^BENCH' "$WORK/vm/console.log" | tr -d '\r' | tee "$WORK/bench.txt"
# Median IOPS per job and disk (the lower middle of an even count), then the ratios.
median() {
  grep -a " job=$1 disk=$2 " "$WORK/bench.txt" | sed 's/.* iops=\([0-9]*\).*/\1/' | sort -n |
    awk '{v[NR]=$1} END{print (NR ? v[int((NR+1)/2)] : 0)}'
}
for job in $(awk '{print $3}' "$WORK/bench.txt" | sed 's/job=//' | awk '!seen[$0]++'); do
  K=$(median "$job" disk)
  Q=$(median "$job" qemu)
  N=$(median "$job" nbd)
  awk -v j="$job" -v k="$K" -v q="$Q" -v n="$N" 'BEGIN{printf "%-18s kura %6d  qemu %6d  nbd %6d  kura/qemu %.2fx  kura/nbd %.2fx\n", j, k, q, n, (q ? k / q : 0), (n ? k / n : 0)}'
done
