#!/usr/bin/env bash
# Builds the CUDA straw2 mapper and runs it on every vector set in VECDIR (default .gpuvec,
# written by `cargo run --release -p kura-crush --example gpu_vectors`), from the repository
# root, on a machine with nvcc and an NVIDIA GPU and nothing else of the project's.
# Then, on the two largest sets, the register-capped build and blocks of 64 and 128 (512
# could exceed the registers of one SM at this kernel's register count; CPU
# reference on the first 100000 inputs only there). Results (one JSON line per run in
# results.jsonl, build log, per-run stderr) go to $OUT if set, else VECDIR/results.
# Exit status 1 if any mapping differed or a run failed, 2 if the build failed.
#
#   bash crates/crush/gpu/run_on_device.sh [VECDIR]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
vec=${1:-.gpuvec}
out=${OUT:-$vec/results}
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin"
{ nvidia-smi -L; nvcc --version | tail -2; g++ --version | head -1; nproc; } 2>&1 | tee "$out/machine.txt"
if ! make -C "$here" -j3 crush_gpu crush_gpu_r64 cpu_check >"$out/build.log" 2>&1; then
    cat "$out/build.log"
    echo "build failed"
    exit 2
fi
grep -E "Used [0-9]+ registers|spill stores" "$out/build.log" | sort | uniq -c | head -20
status=0
: >"$out/results.jsonl"
# run LABEL PROGRAM FLAT EXPECT [ARGS...]
run() {
    local label=$1 prog=$2 flat=$3 expect=$4
    shift 4
    echo "== $label"
    if "$prog" "$flat" "$expect" "$@" >>"$out/results.jsonl" 2>"$out/$label.stderr"; then
        tail -n 1 "$out/results.jsonl"
    else
        status=1
        tail -n 1 "$out/results.jsonl"
        head -c 3000 "$out/$label.stderr"
    fi
}
# The smaller sets are checked in full but timed over 2^22 inputs (the 24-OSD ones retry
# much), the 1M-input ones over 2^24.
for flat in "$vec"/*.flat; do
    name=$(basename "$flat" .flat)
    case "$name" in
    *-1000000) tin=16777216 ;;
    *) tin=4194304 ;;
    esac
    run "$name" "$here/crush_gpu" "$flat" "$vec/$name.expect" --time-inputs $tin ${CRUSH_GPU_ARGS:-}
done
for flat in "$vec"/*-1000000.flat; do
    [ -e "$flat" ] || continue
    name=$(basename "$flat" .flat)
    run "$name.r64" "$here/crush_gpu_r64" "$flat" "$vec/$name.expect" --cpu-inputs 100000
    for b in 64 128; do
        run "$name.b$b" "$here/crush_gpu" "$flat" "$vec/$name.expect" --cpu-inputs 100000 --block $b
    done
done
exit $status
