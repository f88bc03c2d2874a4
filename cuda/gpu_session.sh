#!/bin/bash
# cuda/gpu_session.sh: issues 33's and 50's measurements on a lent H100 or H200, in three commands of
# the device tool, run back to back on the warm machine in this order, then give it back:
#
#   bash cuda/gpu_session.sh proofs    (timeout_s 480; expected about 5 minutes: 55 s on 2026-11-28,
#                                       before the --fused-attention, --one-stream, --bf16, --tf32
#                                       and --no-epilogues runs)
#       make -j16 test-cuda-proofs: ./transformer_cuda and the tests built by nvcc for this GPU,
#       the tests on the GPU (two streams, --one-stream, --fused-attention, --bf16 against
#       transformer.c and against each other), 40-step runs that must write the same checkpoint
#       bit for bit: two, one without CUDA graphs and one on one stream (--one-stream); three with
#       --fused-attention (with and without graphs, on one stream); four with --bf16 (two, without
#       graphs, on one stream); two with --tf32, two with --tf32 --weights-as-stored, two with
#       --no-epilogues; the copy task trained whole in fp32 and with --bf16;
#       compute-sanitizer's memcheck, racecheck, initcheck, synccheck (memcheck and racecheck
#       again with --fused-attention, memcheck and initcheck with --bf16, memcheck and racecheck
#       with --tf32)
#
#   bash cuda/gpu_session.sh profile   (timeout_s 540; estimated about 7 minutes, not yet run)
#       ./transformer_cuda bench --profile: where a base step's time goes at the paper's batch
#       (384 x 64 x 64, vocabulary 37,000), call by call, in fp32, TF32, bf16 and with
#       --fused-attention; tiny's, and with --fused-attention; then, paired and alternating,
#       ROUNDS rounds (default 3; each line a bench's JSON): two streams (the default: the
#       weights' gradients on the second) against --one-stream, base at the paper's batch in
#       fp32, TF32 and bf16 (--steps 5), tiny and toy; --fused-attention against the batched
#       products, tiny, toy, base at 8 x 64 x 64 and at the paper's batch; last, --count of base
#       at the paper's batch on two streams (the graph's nodes as cudaGraphGetNodes counts them:
#       cuBLAS's own kernels). Between them (issue 50, items 2 and 4; "new" is the default, "old"
#       the flag): cuBLASLt's epilogues against --no-epilogues (base at the paper's batch in fp32
#       and TF32, tiny), and --tf32's transposed weights against --weights-as-stored; and
#       (issue 60) mpirun -np 1 over NCCL against the plain companion, train's tokens/s on a
#       base-sized model at 24,576 tokens a batch, 20 steps (where mpirun and NCCL are)
#
#   bash cuda/gpu_session.sh bench     (timeout_s 540; at most about 8 minutes: no run starts after
#                                       330 s, each may take 140 s)
#       make test-cuda-bench: dev/bench_gpu.py with the Makefile's GPU_BENCH: base-25k in fp32,
#       TF32 and bf16 (ours, PyTorch eager, a captured step, torch.compile; bf16: ours --bf16,
#       PyTorch's autocast, the SDPA backend it ran named), then tiny and toy in fp32 (eager, a
#       captured step, reduce-overhead); cuBLAS's SGEMM 8192^3 (and its bf16 GEMM)
#
# Each writes what it printed to $OUT (the device tool's folder that comes back), or runs/ without
# one: proofs.log; profile.log; bench.log and gpu_table.md, and gpu_runs.jsonl with each run's JSON
# as it ended (what a cut run leaves). The budget, 15 minutes of device time: the machine's start
# (1 to 2 minutes), proofs about 5, profile about 7 (ROUNDS=1: about 3), bench about 4 (6.6 minutes
# for the start, proofs and bench on 2026-11-28). With less than 10 minutes left after proofs, run
# bench first, then `ROUNDS=1 bash cuda/gpu_session.sh profile` (about 3 minutes).
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
    rounds=${ROUNDS:-3}
    status=0
    {
        for precision in "" --tf32 --bf16; do
            ./transformer_cuda bench $paper --warmup 1 --steps 3 --profile $precision || exit 1
        done
        ./transformer_cuda bench $paper --warmup 1 --steps 3 --profile --fused-attention || exit 1
        ./transformer_cuda bench --config tiny --warmup 1 --steps 20 --profile || exit 1
        ./transformer_cuda bench --config tiny --warmup 1 --steps 20 --profile --fused-attention || exit 1
        # two streams against one, alternating (the order of the two alternates from round to round)
        for round in $(seq 1 "$rounds"); do
            order="two one"; [ $((round % 2)) -eq 0 ] && order="one two"
            for config in "$paper --steps 5" "$paper --steps 5 --tf32" "$paper --steps 5 --bf16" "--config tiny" \
                          "--config toy"; do
                for variant in $order; do
                    flag=; [ $variant = one ] && flag=--one-stream
                    json=$(./transformer_cuda bench $config --json $flag | tail -n 1) || json=FAILED
                    echo "streams-pair round $round $config $variant: $json"
                done
            done
        done
        # --fused-attention against cuBLAS's batched attention, alternating
        for round in $(seq 1 "$rounds"); do
            order="batched fused"; [ $((round % 2)) -eq 0 ] && order="fused batched"
            for config in "--config tiny" "--config toy" "--config base" "$paper"; do
                for variant in $order; do
                    flag=; [ $variant = fused ] && flag=--fused-attention
                    json=$(./transformer_cuda bench $config --json $flag | tail -n 1) || json=FAILED
                    echo "fused-pair round $round $config $variant: $json"
                done
            done
        done
        # cuBLASLt's epilogues against the kernels, and --tf32's transposed weights against the weights as stored
        for round in $(seq 1 "$rounds"); do
            order="new old"; [ $((round % 2)) -eq 0 ] && order="old new"
            for pair in "epilogues|--no-epilogues|$paper --steps 5" \
                        "epilogues|--no-epilogues|$paper --steps 5 --tf32" \
                        "epilogues|--no-epilogues|--config tiny" \
                        "layout|--weights-as-stored|$paper --steps 5 --tf32"; do
                name=${pair%%|*}; rest=${pair#*|}; old_flag=${rest%%|*}; config=${rest#*|}
                for variant in $order; do
                    flag=; [ $variant = old ] && flag=$old_flag
                    json=$(./transformer_cuda bench $config --json $flag | tail -n 1) || json=FAILED
                    echo "$name-pair round $round $config $variant: $json"
                done
            done
        done
        # mpirun -np 1 over NCCL (one rank: the all-reduce's own cost) against the plain companion,
        # alternating: train's tokens/s on a base-sized model at the paper's batch, 20 steps
        if command -v mpirun >/dev/null && ldd ./transformer_cuda | grep -q libnccl; then
            export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
            nccl_run="train --task copy --layers 6 --d-model 512 --d-ff 2048 --heads 8 --batch-tokens 24576
                      --steps 20 --warmup 10 --eval-every 0 --eval-size 20 --show 0 --log-every 20 --force
                      --checkpoint /tmp/nccl_pair.ckpt"
            for round in $(seq 1 "$rounds"); do
                order="plain nccl"; [ $((round % 2)) -eq 0 ] && order="nccl plain"
                for variant in $order; do
                    launch=; [ $variant = nccl ] && launch="mpirun -q -np 1"
                    line=$($launch ./transformer_cuda $nccl_run | grep '^step ' | tail -n 1)
                    echo "nccl-pair round $round $variant: ${line:-FAILED}"
                done
            done
        else
            echo "nccl-pair: skipped (no mpirun, or ./transformer_cuda built without NCCL)"
        fi
        ./transformer_cuda bench $paper --warmup 1 --steps 2 --count || exit 1
    } 2>&1 | tee "$out/profile.log" || status=1
    grep -q 'FAILED' "$out/profile.log" && status=1
    exit $status
    ;;
*)
    echo "usage: bash cuda/gpu_session.sh proofs|profile|bench (the header says what each runs)" >&2
    exit 2
    ;;
esac
