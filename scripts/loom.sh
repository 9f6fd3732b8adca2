#!/usr/bin/env bash
# Model checks of the lock-free protocols' memory orderings with loom (issue 21): the redirect
# channel and the buffer pool (crates/engine/tests/loom_redirect.rs, loom_pool.rs) and the NVMe
# queue pair against a concurrent device (crates/nvme/src/qpair_loom.rs). The shipped code is
# built with `--cfg loom`, which swaps its atomics, fences, locks and DMA memory for loom's (see
# the crates' `sync` modules), and loom runs each model under every interleaving with at most
# LOOM_MAX_PREEMPTIONS preemptions (default 3 here; each step up costs roughly 8x the time).
# Called by scripts/test.sh; runs alone too. Its own target directory (target/loom): `--cfg loom`
# changes every crate's build, so it must never share one with the normal build.
set -uo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="${RUSTFLAGS:-} --cfg loom"
export CARGO_TARGET_DIR="$PWD/target/loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"

ENGINE=(-p kura-engine --test loom_redirect --test loom_pool)
NVME=(-p kura-nvme --lib)

echo "== loom: build"
start=$SECONDS
cargo test --release --no-run "${ENGINE[@]}" || exit 1
cargo test --release --no-run "${NVME[@]}" || exit 1
echo "loom: build took $((SECONDS - start)) s"

echo "== loom: models (LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS)"
start=$SECONDS
status=0
cargo test --release "${ENGINE[@]}" || status=1
# Only the model: the crate's other unit tests assume real memory and are run by the normal build.
cargo test --release "${NVME[@]}" qpair_loom || status=1
echo "loom: models took $((SECONDS - start)) s"
exit $status
