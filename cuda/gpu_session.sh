#!/bin/bash
# cuda/gpu_session.sh: issue 33's measurement on a lent H100 or H200, in two commands of the device tool
#
#   bash cuda/gpu_session.sh proofs    (timeout_s 420; about 5 minutes)
#       make -j16 test-cuda-proofs: ./transformer_cuda and the tests built by nvcc for this GPU,
#       the tests on the GPU, two 40-step runs and one without CUDA graphs that must write the
#       same checkpoint bit for bit, compute-sanitizer's memcheck, racecheck, initcheck, synccheck
#   bash cuda/gpu_session.sh bench     (timeout_s 540; about 8 minutes)
#       make test-cuda-bench: dev/bench_gpu.py, base-25k first, then tiny, toy and big-25k, fp32
#       and TF32, PyTorch's five columns until the budget (GPU_BENCH's --budget 420) is spent
#
# Each writes what it printed to $OUT (the device tool's folder that comes back), or runs/ without
# one: proofs.log; bench.log, gpu_table.md and gpu_runs.jsonl (each run's JSON as it ended: what a
# cut run leaves). Both together are about 13 of a session's 15 minutes of device time, the
# machine's start included: run them back to back on the warm machine, then give it back.
# Where the lease is shorter, GPU_BENCH="--configs base-25k,tiny --rounds 1 --budget 240" keeps
# the figures that issue 33's goals name.
set -o pipefail
out=${OUT:-runs}
mkdir -p "$out" runs
case "${1:-}" in
proofs)
    make -j16 test-cuda-proofs 2>&1 | tee "$out/proofs.log"
    ;;
bench)
    status=0
    make test-cuda-bench ${GPU_BENCH:+GPU_BENCH="$GPU_BENCH"} 2>&1 | tee "$out/bench.log" || status=$?
    cp runs/gpu_table.md runs/gpu_runs.jsonl "$out/" 2>/dev/null
    exit $status
    ;;
*)
    echo "usage: bash cuda/gpu_session.sh proofs|bench (the header says what each runs)" >&2
    exit 2
    ;;
esac
