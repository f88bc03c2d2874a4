#!/bin/bash
# cuda/gpu_session.sh: issue 33's measurement on a lent H100 or H200, in three commands of the device tool
#
#   bash cuda/gpu_session.sh proofs    (timeout_s 360; 55 s on 2026-11-28, before the --fused-attention runs)
#       make -j16 test-cuda-proofs: ./transformer_cuda and the tests built by nvcc for this GPU,
#       the tests on the GPU, two 40-step runs and one without CUDA graphs that must write the
#       same checkpoint bit for bit (and two with --fused-attention, three with --bf16), the copy task
#       trained whole in fp32 and with --bf16, compute-sanitizer's memcheck, racecheck, initcheck,
#       synccheck (memcheck and racecheck again with --fused-attention, memcheck and initcheck with --bf16)
#   bash cuda/gpu_session.sh bench     (timeout_s 540; at most about 8 minutes)
#       make test-cuda-bench: dev/bench_gpu.py with the Makefile's GPU_BENCH: base-25k in fp32,
#       TF32 and bf16 (ours, PyTorch eager, a captured step, torch.compile; bf16: ours --bf16,
#       PyTorch's autocast, the SDPA backend it ran named), then tiny and toy in fp32 (eager, a
#       captured step, reduce-overhead); cuBLAS's SGEMM 8192^3 (and its bf16 GEMM); no run starts
#       after 330 s, each may take 140 s
#
#   bash cuda/gpu_session.sh profile   (timeout_s 300; about 2 minutes after proofs, on the warm machine)
#       ./transformer_cuda bench --profile: where a base step's time goes at the paper's batch
#       (384 x 64 x 64, vocabulary 37,000), call by call, in fp32, TF32, bf16 and with --fused-attention;
#       tiny's; then --fused-attention against the batched products, tiny, toy and base at the
#       paper's batch, 3 alternating rounds (each line a bench's JSON)
#
# Each writes what it printed to $OUT (the device tool's folder that comes back), or runs/ without
# one: proofs.log; profile.log; bench.log and gpu_table.md, and gpu_runs.jsonl with each run's JSON as it ended
# (what a cut run leaves). On 2026-11-28 the machine's start, proofs and bench took 6.6 of a session's
# 15 minutes of device time; profile adds about 2: run them back to back on the warm machine (proofs,
# profile, bench), then give it back.
# GPU_BENCH="..." in the environment replaces the Makefile's (dev/bench_gpu.py's options).
set -o pipefail
out=${OUT:-runs}
mkdir -p "$out" runs
case "${1:-}" in
proofs)
    make -j16 test-cuda-proofs 2>&1 | tee "$out/proofs.log"
    ;;
bench)
    status=0
    make test-cuda-bench GPU_BENCH_LOG="$out/gpu_runs.jsonl" ${GPU_BENCH:+GPU_BENCH="$GPU_BENCH"} 2>&1 |
        tee "$out/bench.log" || status=$?
    cp runs/gpu_table.md "$out/" 2>/dev/null
    exit $status
    ;;
profile)
    # make rebuilds it only when a source changed since (proofs builds it for this GPU)
    make -j16 transformer_cuda NVCC_ARCH="-arch=sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader |
        head -n 1 | tr -d ' .')" || exit 1
    paper="--config base --batch 384 --src-len 64 --tgt-len 64 --vocab 37000"
    status=0
    {
        for precision in "" --tf32 --bf16; do
            ./transformer_cuda bench $paper --warmup 1 --steps 3 --profile $precision || exit 1
        done
        ./transformer_cuda bench $paper --warmup 1 --steps 3 --profile --fused-attention || exit 1
        ./transformer_cuda bench --config tiny --warmup 1 --steps 20 --profile || exit 1
        # --fused-attention against cuBLAS's batched attention, alternating, 3 rounds (JSON lines)
        # (the order of the two alternates from round to round)
        for round in 1 2 3; do
            order="batched fused"; [ $((round % 2)) -eq 0 ] && order="fused batched"
            for config in "--config tiny" "--config toy" "$paper"; do
                for variant in $order; do
                    flag=; [ $variant = fused ] && flag=--fused-attention
                    json=$(./transformer_cuda bench $config --json $flag | tail -n 1) || json=FAILED
                    echo "fused-pair round $round $config $variant: $json"
                done
            done
        done
    } 2>&1 | tee "$out/profile.log" || status=1
    grep -q 'FAILED' "$out/profile.log" && status=1
    exit $status
    ;;
*)
    echo "usage: bash cuda/gpu_session.sh proofs|bench|profile (the header says what each runs)" >&2
    exit 2
    ;;
esac
