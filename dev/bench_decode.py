#!/usr/bin/python3
"""`make bench-decode`: our decode against CTranslate2, the engine users deploy, on the same model.

For each model (the `make translate` model and its test sentences; base-size random weights
with synthetic sentences), the model is written out as a CTranslate2 directory
(dev/export_ctranslate2.py), then for beam 1 (greedy) and 4 and 1 and 2 threads each engine
translates the same sentences in its own process, in alternating rounds (ours, then each
CTranslate2 setting, then ours again, ...) so that all see the same machine:

- ours: `./transformer decode --checkpoint CKPT --beam B --threads T --subwords < SOURCE`
  (its defaults: sentences sorted by length, 32 side by side); decoding alone is its whole
  process less the median of the same command on an empty input (start and loading);
- CTranslate2 fp32 and int8 (compute_type), each sorted into batches of 32 sentences by length
  (max_batch_size=32, its translate_batch sorting) and as one batch of all: a Python process
  that imports ctranslate2, loads the directory and translates the §5.1 subwords (cut
  beforehand by ./transformer bpe: the cutting is not in its time, it is in ours) with our
  decoding rules (export_ctranslate2.decoding_rules: each batch's length limit is its longest
  sentence's, the outputs cut to each sentence's own); decoding alone is its translate_batch.

A round in which other processes used more than --max-background cores (0.25) during one
of its runs is thrown away and repeated (--retries, 6, at most). Prints per setting the
median of the rounds of target tokens per second (each engine's own
outputs' tokens, without </s>) and the ratios ours / CTranslate2 (above 1: ours faster),
against CTranslate2 fp32's faster setting and int8's, with the CPU and its vector width. Each
run also records the cores other processes used meanwhile (/proc/stat): the busiest is printed.

    /usr/bin/python3 dev/bench_decode.py [--runs 5] [--threads 1,2] [--beams 1,4] [--skip-base]
"""
import argparse
import json
import os
import random
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

from bench_compare import children_cpu_seconds, machine_busy_seconds

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CT2_PYTHON = os.path.join(HERE, ".venv-ct2", "bin", "python")   # make ctranslate2-setup
ALPHA = 0.6


def timed(cmd, stdin_path, env=None):
    """(wall seconds, stdout, cores used by other processes meanwhile) of one process."""
    busy0, ours0, wall0 = machine_busy_seconds(), children_cpu_seconds(), time.perf_counter()
    with open(stdin_path, "rb") as f:
        p = subprocess.run(cmd, stdin=f, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    wall = time.perf_counter() - wall0
    others = (machine_busy_seconds() - busy0 - (children_cpu_seconds() - ours0)) / wall
    if p.returncode != 0:
        sys.exit(f"error: bench-decode: {' '.join(cmd)} exited {p.returncode}: "
                 f"{p.stderr.decode(errors='replace')[-500:]}")
    return wall, p.stdout.decode("utf-8", "surrogateescape"), max(others, 0.0)


def cpu_name_and_vectors():
    name, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and name == "unknown CPU":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    width = "AVX-512 (512-bit)" if "avx512f" in flags else "AVX2 (256-bit)" if "avx2" in flags \
        else "SSE (128-bit)"
    return name, width


# ---- the CTranslate2 process (run with dev/.venv-ct2's Python) -------------------------------

def ct2_worker(a):
    """Loads a CTranslate2 directory and translates a file of subword lines; prints JSON."""
    sys.path.insert(0, HERE)
    started = time.perf_counter()
    import ctranslate2
    from export_ctranslate2 import decoding_rules
    sources = [line.split() for line in open(a.subwords_file, encoding="utf-8",
                                               errors="surrogateescape")]
    translator = ctranslate2.Translator(a.model_dir, device="cpu", compute_type=a.compute_type,
                                        intra_threads=a.threads, inter_threads=1)
    loaded = time.perf_counter()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    size = a.batch if a.batch > 0 else len(sources)
    outputs = [None] * len(sources)
    for first in range(0, len(order), size):
        batch = order[first:first + size]
        longest = max(len(sources[i]) for i in batch)
        rules = decoding_rules(longest, a.max_len)
        results = translator.translate_batch([sources[i] for i in batch], beam_size=a.beam,
                                             length_penalty=ALPHA if a.beam > 1 else 0.0,
                                             max_batch_size=size, **rules)
        for i, r in zip(batch, results):
            limit = decoding_rules(len(sources[i]), a.max_len)["max_decoding_length"]
            outputs[i] = r.hypotheses[0][:limit]
    done = time.perf_counter()
    if a.output:
        with open(a.output, "w", encoding="utf-8", errors="surrogateescape") as f:
            for tokens in outputs:
                f.write(" ".join(tokens) + "\n")
    print(json.dumps(dict(load=loaded - started, decode=done - loaded,
                          tokens=sum(len(t) for t in outputs))))


# ---- the benchmark ---------------------------------------------------------------------------

def prepare(a, name, checkpoint, source, work):
    """The CTranslate2 directory and the subword lines of one model's sentences."""
    out = os.path.join(work, name)
    p = subprocess.run([a.ct2_python, "-c",
                        "import sys; sys.path.insert(0, %r); import export_ctranslate2 as e; "
                        "c = e.export(%r, %r, quiet=True, binary=%r); "
                        "open(%r, 'w').write(str(c['max_len']))"
                        % (HERE, checkpoint, out, a.binary, os.path.join(work, name + ".max_len"))],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"error: bench-decode: exporting {checkpoint}: {p.stderr[-800:]}")
    with open(os.path.join(work, name + ".max_len")) as f:
        max_len = int(f.read())
    subwords = os.path.join(work, name + ".subwords")
    with open(source, "rb") as f, open(subwords, "wb") as g:
        p = subprocess.run([a.binary, "bpe", "--checkpoint", checkpoint], stdin=f, stdout=g,
                           stderr=subprocess.PIPE)
    if p.returncode != 0 and b"has no merges" in p.stderr:
        shutil.copyfile(source, subwords)   # a model of whole words: its tokens are the words
    elif p.returncode != 0:
        sys.exit(f"error: bench-decode: bpe of {source}: {p.stderr.decode(errors='replace')}")
    return out, subwords, max_len


def synthetic_source(path, count, vocab_words, seed):
    """count sentences of 6 to 30 random words of the copy task's vocabulary (0..N-1)."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(count):
            n = rng.randint(6, 30)
            f.write(" ".join(str(rng.randrange(vocab_words)) for _ in range(n)) + "\n")


def bench_model(a, name, checkpoint, source, work, cpu):
    ct2_dir, subwords, max_len = prepare(a, name, checkpoint, source, work)
    empty = os.path.join(work, "empty.txt")
    open(empty, "w").close()
    sentences = sum(1 for _ in open(source, "rb"))
    rows = []
    for threads in a.threads:
        for beam in a.beams:
            ours = [a.binary, "decode", "--checkpoint", checkpoint, "--beam", str(beam),
                    "--alpha", str(ALPHA), "--threads", str(threads), "--subwords"]
            engines = [("ours", None)]
            for compute in ("float32", "int8"):
                for batch in (32, 0):
                    engines.append((f"{compute}/{batch or 'all'}", (compute, batch)))
            walls = {e: [] for e, _ in engines}
            decodes = {e: [] for e, _ in engines}
            tokens = {}
            busiest = 0.0
            starts = []
            kept = thrown = 0
            while kept < a.runs:
                # a round: ours' start, then each engine once; thrown away and repeated (at most
                # --retries times in all) when other processes used more than --max-background
                # cores during one of its runs
                round_walls, round_decodes, round_busiest = {}, {}, 0.0
                start_wall, _out, round_busiest = timed(ours, empty)
                for engine, ct2 in engines:
                    if ct2 is None:
                        wall, out, others = timed(ours, source)
                        tokens[engine] = sum(len(line.split()) for line in out.splitlines())
                        round_decodes[engine] = wall
                    else:
                        compute, batch = ct2
                        cmd = [a.ct2_python, os.path.abspath(__file__), "--worker",
                               "--model-dir", ct2_dir, "--subwords-file", subwords,
                               "--compute-type", compute, "--batch", str(batch),
                               "--worker-threads", str(threads), "--worker-beam", str(beam),
                               "--max-len", str(max_len)]
                        wall, out, others = timed(cmd, empty)
                        r = json.loads(out)
                        tokens[engine] = r["tokens"]
                        round_decodes[engine] = r["decode"]
                    round_walls[engine] = wall
                    round_busiest = max(round_busiest, others)
                if round_busiest > a.max_background and thrown < a.retries:
                    thrown += 1
                    continue
                kept += 1
                starts.append(start_wall)
                busiest = max(busiest, round_busiest)
                for engine, _ in engines:
                    walls[engine].append(round_walls[engine])
                    decodes[engine].append(round_decodes[engine])
            start = statistics.median(starts)
            decodes["ours"] = [w - start for w in decodes["ours"]]
            speed = {}
            for engine, _ in engines:
                speed[engine] = (tokens[engine] / statistics.median(walls[engine]),
                                 tokens[engine] / statistics.median(decodes[engine]))
            rows.append(dict(model=name, threads=threads, beam=beam, speed=speed,
                             tokens=tokens, start=start, busiest=busiest, sentences=sentences,
                             thrown=thrown))
            print_row(rows[-1], cpu)
    return rows


def print_row(r, cpu):
    s = r["speed"]
    for part, k in (("whole process", 0), ("decoding alone", 1)):
        fp32 = max(s["float32/32"][k], s["float32/all"][k])
        int8 = max(s["int8/32"][k], s["int8/all"][k])
        print(f"| {r['model']} | {r['threads']} | {'greedy' if r['beam'] == 1 else 'beam 4'} | "
              f"{part} | {s['ours'][k]:,.0f} | {s['float32/32'][k]:,.0f} / "
              f"{s['float32/all'][k]:,.0f} | {s['int8/32'][k]:,.0f} / {s['int8/all'][k]:,.0f} | "
              f"**{s['ours'][k] / fp32:.2f}x** | {s['ours'][k] / int8:.2f}x |", flush=True)
    print(f"|   | tokens: ours {r['tokens']['ours']:,}, CTranslate2 fp32 "
          f"{r['tokens']['float32/32']:,}, int8 {r['tokens']['int8/32']:,}; ours' start and "
          f"load {r['start']:.2f} s; other processes used at most {r['busiest']:.2f} cores "
          f"({r['thrown']} rounds thrown away) |"
          f" | | | | | | |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "transformer"))
    ap.add_argument("--ct2-python", default=CT2_PYTHON)
    ap.add_argument("--checkpoint", default=os.path.join(ROOT, "runs/translate/de/average.ckpt"))
    ap.add_argument("--source", default=os.path.join(ROOT, "runs/translate/de/test.source"))
    ap.add_argument("--base-checkpoint", default="",
                    help="base-size random weights (default: written by ./transformer train "
                         "--steps 1 into a temporary directory)")
    ap.add_argument("--base-sentences", type=int, default=32)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--beams", default="1,4")
    ap.add_argument("--skip-base", action="store_true")
    ap.add_argument("--max-background", type=float, default=0.25,
                    help="cores other processes may use during a kept round")
    ap.add_argument("--retries", type=int, default=6, help="rounds thrown away at most")
    ap.add_argument("--skip-catalogs", action="store_true")
    # the CTranslate2 process
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--subwords-file", help=argparse.SUPPRESS)
    ap.add_argument("--compute-type", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=32, help=argparse.SUPPRESS)
    ap.add_argument("--worker-threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--worker-beam", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--max-len", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--output", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        a.threads, a.beam = a.worker_threads, a.worker_beam
        ct2_worker(a)
        return 0
    a.threads = [int(t) for t in a.threads.split(",")]
    a.beams = [int(b) for b in a.beams.split(",")]
    for path, what in ((a.binary, "./transformer (make transformer)"),
                       (a.ct2_python, "dev/.venv-ct2 (make ctranslate2-setup)")):
        if not os.path.exists(path):
            sys.exit(f"error: bench-decode: {path} not found; expected {what}")
    version = subprocess.run([a.ct2_python, "-c", "import ctranslate2; "
                              "print(ctranslate2.__version__)"], capture_output=True,
                             text=True).stdout.strip()
    cpu, width = cpu_name_and_vectors()
    print(f"{cpu}, {os.cpu_count()} cores, vectors {width}; CTranslate2 {version}; median of "
          f"{a.runs} alternating runs each; target tokens/s (each engine's own outputs)")
    print("| model | threads | search | time | ours | CTranslate2 fp32 (batches of 32 / one "
          "batch) | int8 (32 / one) | ours / fp32's faster | ours / int8's faster |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench_decode_") as work:
        if not a.skip_catalogs:
            if not os.path.exists(a.checkpoint):
                sys.exit(f"error: bench-decode: {a.checkpoint} not found; make translate "
                         f"writes it (or --checkpoint, --source)")
            bench_model(a, "catalogs", a.checkpoint, a.source, work, cpu)
        if not a.skip_base:
            base = a.base_checkpoint
            if not base:
                base = os.path.join(work, "base.ckpt")
                subprocess.run([a.binary, "train", "--task", "copy", "--words", "7996",
                                "--max-length", "30", "--layers", "6", "--d-model", "512",
                                "--d-ff", "2048", "--heads", "8", "--steps", "1",
                                "--batch-tokens", "200", "--eval-every", "0", "--eval-size",
                                "1", "--show", "0", "--checkpoint", base, "--force"],
                               check=True, stdout=subprocess.DEVNULL)
            source = os.path.join(work, "base.source")
            synthetic_source(source, a.base_sentences, 7996, 61)
            bench_model(a, "base, random", base, source, work, cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
