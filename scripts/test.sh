#!/usr/bin/env bash
# The README's test command, and what .ci/run runs: install what the tests use
# (scripts/setup.sh), then run every test in the workspace. Extra arguments go to `cargo test`.
#
# A test that cannot run here skips through kura_testkit::skip, which logs it; the log is cleared
# first and listed at the end, so a skip never passes unseen. With CI=true a skip not listed in
# .ci/allowed-skips fails its test.
set -uo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh || exit

export KURA_SKIP_LOG="${KURA_SKIP_LOG:-$PWD/target/kura-skips.log}"
mkdir -p "$(dirname "$KURA_SKIP_LOG")"
: >"$KURA_SKIP_LOG"

echo "== cargo test --workspace"
# --no-fail-fast: every failing test and every skip is reported, not only the first crate's.
cargo test --workspace --no-fail-fast "$@"
status=$?

# The same code built for aarch64, a chosen set of its tests under qemu-aarch64 (issue 21).
scripts/aarch64.sh || status=1

# The lock-free protocols' memory orderings under the loom model checker (issue 21).
scripts/loom.sh || status=1

echo "== skipped tests"
if [ -s "$KURA_SKIP_LOG" ]; then
  # test<TAB>capability<TAB>reason
  sort "$KURA_SKIP_LOG" | awk -F'\t' '{ printf "%s: %s: %s\n", $1, $2, $3 }'
else
  echo "none"
fi
exit $status
