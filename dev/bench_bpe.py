#!/usr/bin/python3
"""Time §5.1 merge learning and cutting: ./transformer beside HF tokenizers and subword-nmt.

    python3 dev/make_bpe_corpus.py --pairs 200000 --types 150000 --out /tmp/zipf200k.tsv
    python3 dev/bench_bpe.py --data /tmp/zipf200k.tsv --merges 10000,37000 \\
        --python /tmp/venv/bin/python [--subword-nmt /tmp/venv/bin/subword-nmt --nmt-merges 10000]
    python3 dev/bench_bpe.py --data tiny_data/numbers_train.tsv --merges 100 --python NONE   # smallest

Each tool is its own process, run one after another on the same file and merge counts (the
machine may be shared: compare the ratios of one run, not times of different runs); the wall
time and the peak resident memory (os.wait4's ru_maxrss) of each, a Markdown table on stdout.
  ours: ./transformer bpe --data FILE --merges N (reads the file, learns, prints the merges);
  HF:   tokenizers' BpeTrainer through Tokenizer.train on the same file: models.BPE with the
        end-of-word suffix </w>, pre-tokenizer WhitespaceSplit (our split), min_frequency 2,
        vocab_size = its initial alphabet + N (so that it learns N merges; checked afterwards);
        its threads: RAYON_NUM_THREADS, else every core;
  subword-nmt learn-bpe -s N < FILE (pure Python; only for --nmt-merges, it is slow).
--cut-merges N also times cutting every line of FILE into subwords with N merges: ours,
./transformer bpe --checkpoint CKPT < FILE > /dev/null (reads the lines, cuts each word, prints
the subwords; CKPT from a one-step train --bpe N run first, not timed); HF, encode_batch of the
lines with the tokenizer its trainer made (the lines read and the training done before the clock
starts, so that HF is timed on the cutting alone), in the same process.
--python is the interpreter that has `tokenizers` (pip install tokenizers subword-nmt in a
virtual environment); NONE skips HF. Plain Python 3 runs this script itself.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

HF_CUT_SCRIPT = r'''
import json, sys, time
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
path, merges, alphabet = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tokenizer = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
trainer = trainers.BpeTrainer(vocab_size=alphabet + merges, min_frequency=2, show_progress=False,
                              end_of_word_suffix="</w>", special_tokens=[])
tokenizer.train([path], trainer)
lines = open(path, encoding="utf-8").read().splitlines()
start = time.time()
encodings = tokenizer.encode_batch(lines)
seconds = time.time() - start
tokens = sum(len(e.ids) for e in encodings)
print(json.dumps({"seconds": seconds, "lines": len(lines), "tokens": tokens}))
'''

HF_SCRIPT = r'''
import json, sys, time
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
path, merges, alphabet = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tokenizer = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
trainer = trainers.BpeTrainer(vocab_size=alphabet + merges, min_frequency=2, show_progress=False,
                              end_of_word_suffix="</w>", special_tokens=[])
start = time.time()
tokenizer.train([path], trainer)
seconds = time.time() - start
learned = len(json.loads(tokenizer.to_str())["model"]["merges"])
print(json.dumps({"learned": learned, "train_seconds": seconds}))
'''


def hf_alphabet(path):
    """HF's initial symbols with the suffix on each word's last character (not timed)."""
    inner, final = set(), set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            for word in line.split():
                inner.update(word[:-1])
                final.add(word[-1])
    return len(inner | {c + "</w>" for c in final})


def run(command, stdin=None, env=None):
    """(wall seconds, peak RSS in MB, stdout) of one process."""
    start = time.time()
    process = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               env=env)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.time() - start
    if status != 0:
        raise SystemExit(f"bench_bpe: {command[0]} failed (status {status})")
    return seconds, usage.ru_maxrss / 1024.0, output.decode("utf-8", "replace")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default="./transformer")
    parser.add_argument("--data", required=True)
    parser.add_argument("--merges", default="10000,37000")
    parser.add_argument("--python", default=sys.executable, help="python with tokenizers, or NONE")
    parser.add_argument("--hf-threads", default="", help="RAYON_NUM_THREADS for HF (default: its own)")
    parser.add_argument("--subword-nmt", default="", help="the subword-nmt program (none: skipped)")
    parser.add_argument("--nmt-merges", default="", help="merge counts to run subword-nmt at")
    parser.add_argument("--cut-merges", type=int, default=0, help="also time cutting with N merges")
    args = parser.parse_args()
    merge_counts = [int(m) for m in args.merges.split(",")]
    nmt_counts = [int(m) for m in args.nmt_merges.split(",") if m]
    alphabet = hf_alphabet(args.data) if args.python != "NONE" else 0
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"{args.data}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
          f"load {load} at the start; HF's initial alphabet {alphabet}\n")
    print("| merges | ours s (MB) | HF tokenizers s (MB) | HF / ours | subword-nmt s (MB) | nmt / ours |")
    print("|---|---|---|---|---|---|")
    hf_env = dict(os.environ)
    if args.hf_threads:
        hf_env["RAYON_NUM_THREADS"] = args.hf_threads
    for merges in merge_counts:
        ours, ours_mb, out = run([args.binary, "bpe", "--data", args.data, "--merges", str(merges)])
        first = out.split("\n", 1)[0]
        row = [str(merges), f"{ours:.2f} ({ours_mb:.0f})"]
        if args.python != "NONE":
            hf, hf_mb, hf_out = run([args.python, "-c", HF_SCRIPT, args.data, str(merges), str(alphabet)],
                                    env=hf_env)
            row += [f"{hf:.2f} ({hf_mb:.0f})", f"{hf / ours:.2f}"]
            if f'"learned": {merges}' not in hf_out:
                print(f"note: HF learned other than {merges} merges: {hf_out.strip()}", file=sys.stderr)
        else:
            row += ["-", "-"]
        if args.subword_nmt and merges in nmt_counts:
            with open(args.data, "rb") as f, tempfile.TemporaryFile() as codes:
                nmt, nmt_mb, _ = run([args.subword_nmt, "learn-bpe", "-s", str(merges)], stdin=f)
            row += [f"{nmt:.1f} ({nmt_mb:.0f})", f"{nmt / ours:.1f}"]
        else:
            row += ["-", "-"]
        print("| " + " | ".join(row) + " |", flush=True)
        print(f"ours: {first}", file=sys.stderr)
    if args.cut_merges:
        cut(args, alphabet, hf_env)


def cut(args, alphabet, hf_env):
    """Cutting every line: ours through a checkpoint's merges, HF's encode_batch."""
    import json
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = os.path.join(directory, "cut.ckpt")
        run([args.binary, "train", "--train", args.data, "--bpe", str(args.cut_merges), "--steps", "1",
             "--layers", "1", "--d-model", "16", "--d-ff", "32", "--heads", "2", "--eval-size", "1",
             "--show", "0", "--log-every", "0", "--checkpoint", checkpoint])
        with open(args.data, "rb") as f:
            ours, ours_mb, out = run([args.binary, "bpe", "--checkpoint", checkpoint], stdin=f)
    tokens = len(out.split())
    words = 0
    with open(args.data, encoding="utf-8") as f:
        for line in f:
            words += len(line.split())
    print(f"\ncutting {words} words ({tokens} subwords) with {args.cut_merges} merges:")
    print(f"- ours, bpe --checkpoint < FILE (reading, cutting, printing): {ours:.2f} s, "
          f"{words / ours / 1e6:.2f} M words/s, {ours_mb:.0f} MB")
    if args.python != "NONE":
        _, hf_mb, hf_out = run([args.python, "-c", HF_CUT_SCRIPT, args.data, str(args.cut_merges),
                                str(alphabet)], env=hf_env)
        hf = json.loads(hf_out)
        print(f"- HF tokenizers, encode_batch of the lines read before (cutting only): {hf['seconds']:.2f} s, "
              f"{words / hf['seconds'] / 1e6:.2f} M words/s ({hf['tokens']} subwords); "
              f"ours / HF time {ours / hf['seconds']:.2f}")


if __name__ == "__main__":
    main()
