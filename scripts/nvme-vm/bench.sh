#!/bin/bash
# `kura bench io` on the emulated NVMe controller of the QEMU guest: the user-space driver
# (nvme:BDF), io_uring passthrough (nvme-pt:/dev/ng0n1) and the block layer (uring:/dev/nvme0n1)
# in one run. Leaves OUT_DIR/nvme-io.json, OUT_DIR/nvme-io.png (host matplotlib) and the console
# log. TCG timings say nothing about hardware; the report is labelled so.
#   bench.sh OUT_DIR [EXTRA BENCH ARGS, e.g. --quick]
# The kura binary is target/release/kura (KURA_BIN to change it; build it first).
set -euo pipefail
OUT=$1
shift
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KURA_BIN=${KURA_BIN:-$ROOT/target/release/kura}
[ -x "$KURA_BIN" ] || { echo "no $KURA_BIN: run cargo build --release first" >&2; exit 2; }
mkdir -p "$OUT"
VM="$OUT/vm"
RC=0
KURA_VM_APPEND="kura_bench_args=\"$*\"" "$ROOT/scripts/nvme-vm/run.sh" "$VM" \
  "$ROOT/scripts/nvme-vm/init-bench" 900 "$KURA_BIN" || RC=$?
if [ "$RC" = 77 ]; then
  echo "cannot boot the guest here: $(cat "$VM/skipped")" >&2
  exit 77
fi
tr -d '\r' < "$VM/console.log" | sed -n '/^GUEST-JSON-BEGIN$/,/^GUEST-JSON-END$/p' | sed '1d;$d' > "$OUT/nvme-io.json"
tr -d "\r" < "$VM/console.log" | sed -n "/kura bench io —/,/^GUEST-RESULT/p" | grep -v "^plot skipped"
tr -d "\r" < "$VM/console.log" | grep -E "GUEST dmesg" || true
if [ "$RC" != 0 ] || [ ! -s "$OUT/nvme-io.json" ]; then
  echo "the guest run failed (QEMU status $RC); log: $VM/console.log" >&2
  exit 1
fi
python3 "$ROOT/scripts/plot_bench.py" "$OUT/nvme-io.json" "$OUT/nvme-io.png" &&
  echo "plot: $OUT/nvme-io.png" || echo "plot skipped (python3 with matplotlib needed)"
echo "JSON: $OUT/nvme-io.json"
