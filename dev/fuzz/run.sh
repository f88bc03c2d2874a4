#!/bin/bash
# make fuzz: runs each libFuzzer target (runs/fuzz/fuzz_TARGET, built by make)
# for FUZZ_SECONDS (default 60) from seeds made here (tiny_data, small files
# written below, checkpoints and a log from ./transformer), then prints a
# summary. Everything goes under runs/fuzz/TARGET/: seeds/, corpus/ (what the
# fuzzer found worth keeping; kept between runs, so a later run starts
# further on), log, and crash-*, leak-*, timeout-*, oom-* for an input that
# failed; reproduce one with runs/fuzz/fuzz_TARGET FILE. Exit status 1 when
# any target found something. Run from the project's top folder.
set -u
seconds=${FUZZ_SECONDS:-60}
targets=("$@")
top=runs/fuzz
bin=./transformer
[ -x "$bin" ] || { echo "fuzz: $bin is not built (make fuzz builds it)"; exit 1; }

# checkpoints of tiny models, version 4 as ./transformer writes them (the model, then the run): words,
# §5.1 subwords (the run's merges section), learned positions; the copy task's model alone (its
# first model_bytes bytes, as transformer.c alone writes it); and tiny_data/v3's real version-3 files
seeds_checkpoint() {
    local d=$1 tiny="--layers 1 --d-model 8 --d-ff 8 --heads 2 --log-every 0 --eval-every 0 --show 0 --force"
    head -n 12 tiny_data/numbers_train.tsv > "$d/../numbers12.tsv"
    $bin train --task copy --words 6 --max-length 4 --train-size 20 --valid-size 4 --steps 2 $tiny \
        --checkpoint "$d/copy.ckpt" > /dev/null
    $bin train --train "$d/../numbers12.tsv" --bpe 20 --steps 1 --max-length 40 $tiny --checkpoint "$d/bpe.ckpt" > /dev/null
    $bin train --task reverse --words 5 --max-length 4 --train-size 20 --valid-size 4 --steps 1 --positional learned \
        $tiny --checkpoint "$d/learned.ckpt" > /dev/null
    local model_bytes
    model_bytes=$(od -An -t u8 -j 64 -N 8 "$d/copy.ckpt" | tr -d ' ')   # CheckpointHeader.model_bytes
    head -c "$model_bytes" "$d/copy.ckpt" > "$d/copy_model_only.ckpt"
    cp tiny_data/v3/*.ckpt "$d/"
}
seeds_tsv_bpe() {
    head -n 40 tiny_data/numbers_train.tsv > "$1/numbers.tsv"
    printf '<s>a x\t</s>b y\n<s>c x\t</s>d y\n<pad>e x\t<unk>f y\nx<pad> x\t<unk>h y\n' > "$1/special.tsv"
    printf '<s>x\t<s>c' > "$1/found_special.tsv"     # what fuzz_tsv_bpe found before the fix
    printf '\xef\xbb\xbfa\xe3\x80\x80b\xc2\xa0c\tc\xe2\x80\x83b a\r\n\xe3\x80\x80\n\na b\tb a\n' > "$1/spaces.tsv"
    printf 'caf\xe9 \xff\xfe\tb \xc3\n\xc3\xa4\xc3\xa4 \xc3\xa4\t\xc3\xa4 x\n' > "$1/bytes.tsv"
}
seeds_bpe_apply() {
    sed -n '1,3p' tiny_data/numbers_dev.tsv | cut -f2 > "$1/german.txt"
    sed -n '1,3p' tiny_data/numbers_dev.tsv | cut -f1 > "$1/english.txt"
    printf 'zweiundvierzig\xe3\x80\x80<s>0 a<pad> </s>x \xff\xfe caf\xe9 \xc3' > "$1/odd.txt"
}
seeds_bleu() { # 2 bytes: where the hypothesis file ends; then both files
    local hyp ref
    hyp=$(sed -n '1,4p' tiny_data/numbers_test.tsv | cut -f2); ref=$(sed -n '2,5p' tiny_data/numbers_test.tsv | cut -f2)
    { printf "\\x$(printf %02x $(( (${#hyp} + 1) % 256 )))\\x$(printf %02x $(( (${#hyp} + 1) / 256 )))"
      printf '%s\n%s\n' "$hyp" "$ref"; } > "$1/numbers.bin"
    printf '\x2a\x00the\xc2\xa0cat sat on\xe3\x80\x80the mat\n\xe3\x80\x80a\xe3\x80\x80b\nthe cat\xc2\xa0sat on the mat\na b\n' > "$1/spaces.bin"
    printf '\x08\x00caf\xe9 a\nb\ncafe a\nb\n' > "$1/latin1.bin"
}
seeds_training_log() {
    $bin train --task copy --words 6 --max-length 4 --train-size 20 --valid-size 4 --steps 4 --layers 1 --d-model 8 \
        --d-ff 8 --heads 2 --log-every 1 --eval-every 2 --show 0 --force --checkpoint "$1/../log.ckpt" \
        --log "$1/train.csv" > /dev/null
    printf 'step,loss,lr,tokens_per_s,heldout\n1,3.5,0.0001,1000,\n10,2.0,0.001,1100,0.1\n20,0.5,0.002,1050,\n' > "$1/header.csv"
    printf '1,5,0,1,0x1p-1070\n' > "$1/subnormal.csv"
    printf '1,1e-300,0.1,1,\n2,1e300,0.1,1,\n3,inf,nan,1,\n' > "$1/extremes.csv"
}
# a .mo catalog written byte by byte: le or be, then each original and its translation (a \x04 or a zero
# byte inside a field is a context or a plural)
mo_word() { if [ "$1" = le ]; then printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($2 & 255)) $(($2 >> 8 & 255)) \
    $(($2 >> 16 & 255)) $(($2 >> 24)); else printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($2 >> 24)) \
    $(($2 >> 16 & 255)) $(($2 >> 8 & 255)) $(($2 & 255)); fi; }
mo_catalog() {
    local order=$1 n=$(( ($# - 1) / 2 )) header="" strings="" at i
    at=$((28 + 16 * n))
    header=$(mo_word "$order" $((0x950412de)))$(mo_word "$order" 0)$(mo_word "$order" $n)
    header+=$(mo_word "$order" 28)$(mo_word "$order" $((28 + 8 * n)))$(mo_word "$order" 0)$(mo_word "$order" $at)
    shift
    local texts=("$@") originals="" translations=""
    for ((i = 0; i < n; i++)); do
        local o=${texts[2 * i]} t=${texts[2 * i + 1]} lo lt
        lo=$(printf "$o" | wc -c); lt=$(printf "$t" | wc -c)
        originals+=$(mo_word "$order" "$lo")$(mo_word "$order" "$at"); at=$((at + lo + 1))
        translations+=$(mo_word "$order" "$lt")$(mo_word "$order" "$at"); at=$((at + lt + 1))
        strings+="$o\\x00$t\\x00"
    done
    printf "$header$originals$translations$strings"
}
seeds_catalogs() {
    mo_catalog le '' 'Language: de\n' 'the file is open' 'die Datei ist offen' 'menu\x04open it now' \
        'jetzt \xc3\xb6ffnen' > "$1/little.mo"
    mo_catalog be 'one file was removed\x00files were removed' 'eine Datei\x00Dateien' 'cannot open %%s' \
        'kann %%s nicht' '_Save the file' 'Datei _speichern' 'the disk is full' 'die Platte ist voll' > "$1/big.mo"
    head -c 40 "$1/little.mo" > "$1/truncated.mo"
}
seeds_reference() { cp tiny_data/ref_1layer_3head.ref tiny_data/ref_1layer_4head.ref "$1/"; }

declare -A max_len=( [checkpoint]=131072 [reference]=140000 [bleu]=4096 [training_log]=4096 [tsv_bpe]=8192 [bpe_apply]=4096 [catalogs]=8192 )
found=0
summary=()
for t in "${targets[@]}"; do
    dir=$top/$t
    rm -rf "$dir/seeds" "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-*
    mkdir -p "$dir/seeds" "$dir/corpus"
    "seeds_$t" "$dir/seeds"
    echo "fuzz: $t for $seconds s from $(ls "$dir/seeds" | wc -l) seeds and $(ls "$dir/corpus" | wc -l) kept inputs"
    "$top/fuzz_$t" -max_total_time="$seconds" -max_len="${max_len[$t]}" -timeout=20 -rss_limit_mb=4096 \
        -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$dir/" "$dir/corpus" "$dir/seeds" > "$dir/log" 2>&1
    status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log")
    cov=$(grep -o 'cov: [0-9]*' "$dir/log" | tail -n 1)
    failed=$(ls "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* 2>/dev/null)
    if [ $status -ne 0 ] || [ -n "$failed" ]; then
        found=1
        summary+=("$(printf '%-13s FOUND (exit %d): %s; see %s/log' "$t" $status "${failed:-no input saved}" "$dir")")
    else
        summary+=("$(printf '%-13s %9s runs in %s s, %s, no finding' "$t" "${runs:-?}" "$seconds" "${cov:-cov: ?}")")
    fi
done
echo "== make fuzz: libFuzzer + AddressSanitizer + UBSan, $seconds s per target"
printf '%s\n' "${summary[@]}"
exit $found
