#!/bin/bash
# `kura bench io` in the aarch64 guest (run-aarch64.sh, init-aarch64-bench): the user-space
# driver (nvme:BDF, VFIO behind the virt machine's SMMUv3), io_uring passthrough
# (nvme-pt:/dev/ng0n1) and the block layer (uring:/dev/nvme0n1) on the emulated NVMe controller,
# in one run. Leaves OUT_DIR/nvme-io.json, OUT_DIR/nvme-io.png (host matplotlib) and the console
# log in OUT_DIR/vm. On an x86-64 host the guest CPU is emulated (TCG): the report is labelled so
# and its timings say nothing about ARM hardware.
#   bench-aarch64.sh OUT_DIR [EXTRA BENCH ARGS, e.g. --quick]
# KURA_BIN: the aarch64 kura binary (default target/aarch64/aarch64-unknown-linux-gnu/release/kura;
# build it with scripts/aarch64.sh's environment and `cargo build --release -p kura --target
# aarch64-unknown-linux-gnu`).
# On real ARM hardware: build natively (`cargo build --release -p kura`, KURA_BIN=target/release/kura)
# and either run `kura bench io --device ...` on the machine's own NVMe drive directly, or boot
# this guest with KVM (KURA_VM_ACCEL=kvm, which run-aarch64.sh pairs with `-cpu host`) to measure
# the same emulated controller without CPU emulation.
set -euo pipefail
OUT=$1
shift
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KURA_BIN=${KURA_BIN:-$ROOT/target/aarch64/aarch64-unknown-linux-gnu/release/kura}
[ -x "$KURA_BIN" ] || { echo "no $KURA_BIN: build kura for aarch64 first (see the header of $0)" >&2; exit 2; }
mkdir -p "$OUT"
VM="$OUT/vm"
RC=0
KURA_VM_APPEND="kura_bench_args=\"$*\"" "$ROOT/scripts/nvme-vm/run-aarch64.sh" "$VM" \
  "$ROOT/scripts/nvme-vm/init-aarch64-bench" "${KURA_VM_TIMEOUT:-1200}" "$KURA_BIN" || RC=$?
if [ "$RC" = 77 ]; then
  echo "cannot boot the aarch64 guest here: $(cat "$VM/skipped")" >&2
  exit 77
fi
tr -d '\r' < "$VM/console.log" | sed -n '/^GUEST-JSON-BEGIN$/,/^GUEST-JSON-END$/p' | sed '1d;$d' > "$OUT/nvme-io.json"
tr -d "\r" < "$VM/console.log" | sed -n "/kura bench io —/,/^GUEST-RESULT/p" | grep -v "^plot skipped" || true
tr -d "\r" < "$VM/console.log" | grep -E "GUEST dmesg" || true
if [ "$RC" != 0 ] || [ ! -s "$OUT/nvme-io.json" ]; then
  echo "the guest run failed (QEMU status $RC); log: $VM/console.log" >&2
  exit 1
fi
python3 "$ROOT/scripts/plot_bench.py" "$OUT/nvme-io.json" "$OUT/nvme-io.png" &&
  echo "plot: $OUT/nvme-io.png" || echo "plot skipped (python3 with matplotlib needed)"
echo "JSON: $OUT/nvme-io.json"
