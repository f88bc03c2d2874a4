#!/bin/bash
# make dev-check: every script in dev/ on its smallest case, as its docstring
# runs it, each in seconds; no network. Not part of make test. A script whose
# Python is not installed is skipped with a line saying so: PyTorch 2.x in
# dev/.venv (make bench-setup), Debian's python3-torch at /usr/bin/python3,
# plain python3 for the rest. Needs ./transformer, ./test_transformer and
# ./test_transformer_f64 (make dev-check builds them). Prints a line per
# check and a summary; exit status 1 when any check failed. Run from the
# project's top folder.
set -u
venv=${DEV_VENV:-dev/.venv}/bin/python
system=/usr/bin/python3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dev-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ok=0; failed=0; skipped=0; start=$(date +%s)

# has_torch PYTHON [MAJOR]: PYTHON exists and has PyTorch (version MAJOR.x or later), without importing it
has_torch() {
    [ -x "$1" ] && "$1" -c 'import importlib.metadata as m, sys
sys.exit(int(m.version("torch").split(".")[0]) < int(sys.argv[1]))' "${2:-0}" 2>/dev/null
}
# run NAME WHAT FUNCTION: runs FUNCTION, its output kept in a log shown when it fails
run() {
    local name=$1 what=$2 t0=$EPOCHREALTIME
    if "$3" > "$tmp/log" 2>&1; then
        ok=$((ok + 1)); printf 'ok    %-26s %5.1f s  %s\n' "$name" "$(awk "BEGIN { print $EPOCHREALTIME - $t0 }")" "$what"
    else
        failed=$((failed + 1)); printf 'FAIL  %-26s %s\n' "$name" "$what"; tail -n 25 "$tmp/log" | sed 's/^/      | /'
    fi
}
skip() { skipped=$((skipped + 1)); printf 'skip  %-26s %s\n' "$1" "$2"; }

# ---- plain Python 3 (and a C compiler) ----
numbers() {
    python3 dev/make_numbers.py --out-dir "$tmp/numbers" &&
    for s in train dev test; do cmp "$tmp/numbers/numbers_$s.tsv" "tiny_data/numbers_$s.tsv" || return 1; done
}
run make_numbers.py "the three splits again (seed 2017), byte for byte those in tiny_data/" numbers
bleu() { python3 dev/bleu_check.py; }
run bleu_check.py "BLEU of the test cases, our own count (and NLTK's where installed)" bleu
profile() { python3 dev/profile_step.py --config tiny --steps 1 --threads 1; }
run profile_step.py "--config tiny --steps 1 --threads 1: the instrumented lab built, its table" profile
pair() { python3 dev/bench_pair.py ./transformer ./transformer --configs tiny --pairs 1 --threads 1 --max-background 64; }
run bench_pair.py "./transformer against itself, tiny, 1 pair" pair
bpe_corpus() {
    python3 dev/make_bpe_corpus.py --pairs 50 --types 40 --out "$tmp/tiny_bpe.tsv" &&
    python3 dev/bench_bpe.py --data "$tmp/tiny_bpe.tsv" --merges 20 --python NONE --cut-merges 20
}
run make_bpe_corpus.py "50 pairs over 40 word types, and bench_bpe.py's table on them without HF (20 merges)" bpe_corpus
explain() {
    ./transformer train --task copy --steps 200 --layers 1 --d-model 32 --d-ff 64 --heads 2 --eval-every 0 --show 0 \
        --log-every 0 --threads 1 --checkpoint "$tmp/copy.ckpt" &&
    printf '3 1 4 1 5\n2 7 1 8\n9 9 0 4\n' > "$tmp/copy.source" &&
    python3 dev/explain_check.py "$tmp/copy.ckpt" "$tmp/copy.source" --count 3
}
run explain_check.py "explain's page against decode on a copy model of 200 steps, 3 sentences, greedy and beam 4" explain
busy() { python3 dev/bench_busy.py --configs toy --neighbours yes --rounds 1 --extra '--steps 3 --log-every 1'; }
run bench_busy.py "toy for 3 steps, alone and beside yes, 1 round" busy
ranks() { python3 dev/bench_ranks.py --configs copy --pairs 1; }
if command -v mpirun >/dev/null && ldd ./transformer | grep -q libmpi; then
    run bench_ranks.py "copy, mpirun -np 2 against 2 threads, 1 pair" ranks
else
    skip bench_ranks.py "no mpirun, or ./transformer built without MPI (make MPI=0)"
fi
gpu() { python3 dev/bench_gpu.py --binary ./transformer --configs tiny --rounds 1 --python ''; }
run bench_gpu.py "its table on the CPU: ./transformer for ./transformer_cuda, no PyTorch (the GPU runs: make test-cuda)" gpu
fma() { gcc -O3 -march=native -funroll-loops -fopenmp -o "$tmp/fma_peak" dev/fma_peak.c && OMP_NUM_THREADS=1 "$tmp/fma_peak"; }
run fma_peak.c "built and run on one thread" fma
speed() {
    local flags="-O3 -march=native -ffp-contract=fast -fno-math-errno -std=c11 -Wall -Wextra -Werror -fopenmp -I ."
    gcc $flags -o "$tmp/product_speed" dev/product_speed.c -lm && OMP_NUM_THREADS=1 "$tmp/product_speed" 1 &&
    gcc $flags -o "$tmp/replay" dev/fast_path_replay.c -lm && OMP_NUM_THREADS=1 "$tmp/replay" tiny 1
}
run product_speed.c "and fast_path_replay.c: built as their comments say, each run once on one thread" speed
fuzz() {
    local cc=clang t; command -v clang > /dev/null || cc=gcc
    bash -n dev/fuzz/run.sh &&
    for t in dev/fuzz/fuzz_*.c; do "$cc" -fsyntax-only -std=c11 -Wall -Wextra -Werror -I. "$t" || return 1; done
}
run fuzz/ "each target compiled (-fsyntax-only, no warning); make fuzz FUZZ_SECONDS=5 builds and runs them (minutes)" fuzz

# ---- PyTorch 2.x in dev/.venv ----
SMALL="--layers 1 --d-model 16 --d-ff 32 --heads 2 --vocab 20 --batch 2 --src-len 4 --tgt-len 4 --threads 1 --warmup 1 --steps 2 --json"
if has_torch "$venv" 2; then
    torch2() { OMP_NUM_THREADS=1 "$venv" dev/bench_pytorch.py $SMALL && OMP_NUM_THREADS=1 "$venv" dev/bench_pytorch.py $SMALL --decode --kv-cache; }
    run bench_pytorch.py "PyTorch 2.x: a tiny model's training steps, then cached decoding (eager)" torch2
    compare() { python3 dev/bench_compare.py --binary ./transformer --python "$venv" --configs tiny --decode-configs '' \
                    --rounds 1 --threads 1 --no-compile --max-background 64 --quiet-wait 0; }
    run bench_compare.py "make bench's table for tiny, 1 round, no torch.compile" compare
    reference() { "$venv" dev/make_reference.py --out "$tmp/small.ref"; }
    run make_reference.py "a reference file of the default sizes (format version 2)" reference
    read_() { "$venv" dev/read_reference.py "$tmp/small.ref"; }
    run read_reference.py "that file parsed and recomputed, in PyTorch and in plain float64" read_
    seeds() { "$venv" dev/reference_seeds.py "$tmp/small.ref" tiny_data/ref_1layer_4head.ref; }
    run reference_seeds.py "that file and a committed one, by ./test_transformer_f64 and ./test_transformer" seeds
    skip "torch.compile" "bench_pytorch.py --compile and --check-setup compile for a minute or more: make bench-setup, make bench"
    if "$venv" -c 'import sacrebleu' 2>/dev/null; then
        sacre() { "$venv" dev/bleu_check.py --sacrebleu ./transformer; }
        run "bleu_check.py --sacrebleu" "./transformer bleu against sacreBLEU on 20 random corpora" sacre
    else
        skip "bleu_check.py --sacrebleu" "$venv has no sacrebleu (pip install sacrebleu)"
    fi
else
    for s in bench_pytorch.py bench_compare.py make_reference.py read_reference.py reference_seeds.py; do
        skip "$s" "needs PyTorch 2.x in dev/.venv (make bench-setup; $venv has none)"
    done
fi

# ---- Debian's PyTorch (python3-torch) at /usr/bin/python3 ----
if has_torch "$system"; then
    torch1() { OMP_NUM_THREADS=1 "$system" dev/bench_pytorch.py $SMALL; }
    run "bench_pytorch.py 1.x" "Debian's PyTorch: the same training steps" torch1
else
    skip "bench_pytorch.py 1.x" "Debian's PyTorch: $system has no torch (apt-get install python3-torch)"
fi
export_python=$system
has_torch "$system" || export_python=$venv
if has_torch "$export_python"; then
    export_() {
        head -n 30 tiny_data/numbers_train.tsv > "$tmp/numbers30.tsv" &&
        ./transformer train --train "$tmp/numbers30.tsv" --bpe 20 --positional learned --steps 2 --max-length 40 \
            --layers 1 --d-model 16 --d-ff 16 --heads 2 --log-every 0 --eval-every 0 --show 0 --force \
            --checkpoint "$tmp/small.ckpt" &&
        "$export_python" dev/export_pytorch.py "$tmp/small.ckpt" --out "$tmp/small.pt"
    }
    run export_pytorch.py "a 2-step checkpoint (subwords, learned positions) to PyTorch, compared by ./test_transformer ($export_python)" export_
    export_minimal() {
        gcc -O3 -march=native -fopenmp -std=c11 -Wall -Wextra -o "$tmp/transformer_minimal" transformer.c -lm &&
        OMP_NUM_THREADS=1 "$tmp/transformer_minimal" train --task copy --steps 2 --layers 1 --d-model 16 --d-ff 16 \
            --heads 2 --checkpoint "$tmp/minimal.ckpt" > /dev/null &&
        "$export_python" dev/export_pytorch.py "$tmp/minimal.ckpt" --out "$tmp/minimal.pt"
    }
    run "export_pytorch.py minimal" "a checkpoint of transformer.c alone (version 4, no run part: built as make minimal builds it)" export_minimal
    export_v3() {
        "$export_python" dev/export_pytorch.py tiny_data/v3/numbers_bpe_step40.ckpt --out "$tmp/v3.pt" --reference "$tmp/v3.ref"
    }
    run "export_pytorch.py v3" "tiny_data/v3/numbers_bpe_step40.ckpt, a version-3 checkpoint (subwords), to PyTorch" export_v3
    peer() {
        local d=$tmp/translate
        mkdir -p "$d" && head -n 200 tiny_data/numbers_train.tsv > "$d/train.tsv" &&
        head -n 20 tiny_data/numbers_test.tsv > "$d/test.tsv" && cut -f1 "$d/test.tsv" > "$d/test.source" &&
        cut -f2 "$d/test.tsv" > "$d/test.reference" &&
        ./transformer train --train "$d/train.tsv" --bpe 50 --steps 30 --warmup 10 --layers 1 --d-model 16 --d-ff 32 \
            --heads 2 --batch-tokens 300 --log-every 0 --eval-every 0 --save-every 10 --keep-last 2 --show 0 --force \
            --threads 1 --checkpoint "$d/model.ckpt" --batch-log "$d/batches.bin" --loss-log "$d/loss.txt" > /dev/null &&
        "$export_python" dev/pytorch_translate.py --dir "$d" --window 10 --threads 1
    }
    run pytorch_translate.py "the PyTorch peer of make translate on a 30-step numbers run, steps 20 and 30 kept and averaged ($export_python)" peer
else
    for s in export_pytorch.py "export_pytorch.py minimal" "export_pytorch.py v3"; do
        skip "$s" "needs PyTorch: Debian's python3-torch at $system, or dev/.venv (make bench-setup)"
    done
    skip pytorch_translate.py "needs PyTorch: Debian's python3-torch at $system, or dev/.venv (make bench-setup)"
fi

echo "dev-check: $ok ok, $failed failed, $skipped skipped in $(( $(date +%s) - start )) s"
[ $failed -eq 0 ]
