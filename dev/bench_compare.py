#!/usr/bin/python3
"""`make bench`: transformer.c against PyTorch, the same training step (and greedy decoding) side by side.

For each config, runs `./transformer bench --config NAME --json` and
dev/bench_pytorch.py with the sizes transformer.c reported, alternating
(C, PyTorch, C, PyTorch, ...) so that both see the same machine state, each in
its own process with the same number of threads. Greedy decoding runs
PyTorch twice per round: its layers over the whole prefix, and the same
weights with a key/value cache (bench_pytorch.py --kv-cache), the fair match
for transformer.c's cached decoding. Then prints a table per mode: the
median over the rounds of each side's median time, and the ratio
PyTorch time / transformer.c time (above 1: transformer.c is faster). The
heading names the BLAS PyTorch used (bench_pytorch.py's "blas").

On a shared machine other processes can take the cores in the middle of a
run. Each run reports how many cores other processes used meanwhile; a round
in which any run saw more than --max-background cores of other work is
thrown away and repeated after a pause (at most --retries times), and the
table's heading says how many were thrown away and the background load of
the rounds it kept.

    /usr/bin/python3 dev/bench_compare.py [--configs tiny,toy,base] [--decode-configs tiny,toy,base]
                                          [--rounds 3] [--threads 2]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTORCH_PYTHON = "/usr/bin/python3"   # Debian's interpreter, which has python3-torch


def machine_busy_seconds():
    """CPU time the whole machine has spent busy (all processes), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]            # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_json(cmd, env):
    """Runs one benchmark; returns its JSON line, with "background_load": the
    CPU time other processes on the machine took meanwhile, in cores."""
    busy0, ours0, wall0 = machine_busy_seconds(), children_cpu_seconds(), time.perf_counter()
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    busy1, ours1, wall1 = machine_busy_seconds(), children_cpu_seconds(), time.perf_counter()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"error: no JSON line from: {' '.join(cmd)}\n{out}")
    result = json.loads(lines[-1])
    result["background_load"] = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (wall1 - wall0)
    return result


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default="./transformer")
    p.add_argument("--configs", default="tiny,toy,base", help="configs whose training step is timed")
    p.add_argument("--decode-configs", default="tiny,toy,base",
                   help="configs whose greedy decoding is timed ('' for none)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-background", type=float, default=0.1,
                   help="cores of other work above which a round is repeated")
    p.add_argument("--retries", type=int, default=5, help="repeats of one round at most")
    a = p.parse_args(argv)
    # fail before the first run, in one line, if the interpreter of the PyTorch side has no PyTorch
    has_torch = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    if subprocess.run([PYTORCH_PYTHON, "-c", has_torch]).returncode != 0:
        sys.exit(f"error: dev/bench_compare.py (make bench) needs PyTorch for {PYTORCH_PYTHON}: "
                 "apt-get install python3-torch libopenblas0-openmp (README.md)")
    discarded = 0
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))

    def run_round(name, mode):
        """transformer.c then PyTorch, the same config: their JSON results, PyTorch's
        a list (decoding: its layers over the whole prefix, then with a key/value cache)."""
        flag = ["--decode"] if mode == "decode" else []
        c = run_json([a.binary, "bench", "--config", name, "--threads", str(a.threads), "--json"] + flag, env)
        pytorch = [PYTORCH_PYTHON, os.path.join(HERE, "bench_pytorch.py"), "--json",
                   "--config", name, "--layers", str(c["layers"]), "--d-model", str(c["d_model"]),
                   "--d-ff", str(c["d_ff"]), "--heads", str(c["heads"]), "--vocab", str(c["vocab"]),
                   "--batch", str(c["batch"]), "--src-len", str(c["src_len"]),
                   "--tgt-len", str(c["tgt_len"]), "--dropout", str(c["dropout"]),
                   "--label-smoothing", str(c["label_smoothing"]), "--threads", str(a.threads),
                   "--warmup", str(c["warmup"]), "--steps", str(c["steps"])] + flag
        variants = [[], ["--kv-cache"]] if mode == "decode" else [[]]
        return c, [run_json(pytorch + v, env) for v in variants]

    def run_config(name, mode):
        """The rounds of one config; the results kept, transformer.c's and PyTorch's."""
        nonlocal discarded
        ours, theirs = [], []
        for r in range(a.rounds):
            for attempt in range(a.retries + 1):
                c, ts = run_round(name, mode)
                busy = max(x["background_load"] for x in [c] + ts) > a.max_background
                retry = busy and attempt < a.retries
                print(f"  {name} {mode} round {r + 1}: transformer.c {c['median_ms']:.1f} ms, PyTorch "
                      + ", ".join(f"{t['median_ms']:.1f} ms" for t in ts)
                      + " (other processes meanwhile: "
                      + ", ".join(f"{x['background_load']:.2f}" for x in [c] + ts) + " cores)"
                      + ("; repeating it" if retry else ""), file=sys.stderr)
                if not retry:
                    break
                discarded += 1
                time.sleep(10)
            ours.append(c)
            theirs.append(ts)
        return name, ours, theirs

    train = [run_config(name, "train") for name in a.configs.split(",") if name]
    decode = [run_config(name, "decode") for name in a.decode_configs.split(",") if name]
    everything = train + decode
    if not everything:
        sys.exit("error: no configs to run")

    def med(results, key):
        return statistics.median(x[key] for x in results)

    def size_columns(c):
        return (f"| {c['config']} | {c['layers']} | {c['d_model']} | {c['d_ff']} | {c['heads']} | {c['vocab']} | "
                f"{c['batch']} x {c['src_len']} x {c['tgt_len']} |")

    def memory_columns(ours, theirs):
        return (f" {med(ours, 'peak_mb'):.0f} ({med(ours, 'step_mb'):.0f}) | "
                f"{med(theirs, 'peak_mb'):.0f} ({med(theirs, 'step_mb'):.0f}) |")

    background = statistics.mean(x["background_load"] for _, o, t in everything
                                 for x in o + [y for ts in t for y in ts])
    first_pytorch = everything[0][2][0][0]
    print(f"{cpu_name()}, {os.cpu_count()} cores, {a.threads} threads; PyTorch {first_pytorch['torch']} "
          f"with {first_pytorch.get('blas', 'its BLAS')}; median of {a.rounds} alternating rounds, each the "
          f"median of its timed runs; other processes used {background:.2f} cores on average meanwhile"
          f"{f' ({discarded} busier rounds thrown away and repeated)' if discarded else ''}")
    if train:
        print("\nTraining step (forward, backward, Adam):\n")
        print("| config | N | d_model | d_ff | h | vocab | batch (B x S x T) | transformer.c ms/step | "
              "PyTorch ms/step | PyTorch / ours | ours tokens/s | PyTorch tokens/s | ours GFLOP/s | "
              "PyTorch GFLOP/s | ours peak MB (step) | PyTorch peak MB (step) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, ours, theirs in train:
            theirs = [ts[0] for ts in theirs]
            mo, mt = med(ours, "median_ms"), med(theirs, "median_ms")
            print(f"{size_columns(ours[0])} {mo:.1f} | {mt:.1f} | **{mt / mo:.2f}** | "
                  f"{med(ours, 'tokens_per_s'):.0f} | {med(theirs, 'tokens_per_s'):.0f} | "
                  f"{med(ours, 'gflops'):.1f} | {med(theirs, 'gflops'):.1f} |" + memory_columns(ours, theirs))
    if decode:
        print("\nGreedy decoding of the batch's sources, T tokens each. Ours: key/value cache. PyTorch: "
              "its layers over the whole prefix at every position (layers), and the same weights one "
              "position at a time with a key/value cache (cached, dev/bench_pytorch.py --kv-cache):\n")
        print("| config | N | d_model | d_ff | h | vocab | batch (B x S x T) | transformer.c ms/batch | "
              "PyTorch layers ms/batch | PyTorch cached ms/batch | layers / ours | cached / ours | "
              "ours tokens/s | PyTorch layers tokens/s | PyTorch cached tokens/s | "
              "ours peak MB (step) | PyTorch cached peak MB (step) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, ours, theirs in decode:
            layers, cached = [ts[0] for ts in theirs], [ts[1] for ts in theirs]
            mo, ml, mc = med(ours, "median_ms"), med(layers, "median_ms"), med(cached, "median_ms")
            print(f"{size_columns(ours[0])} {mo:.1f} | {ml:.1f} | {mc:.1f} | {ml / mo:.2f} | **{mc / mo:.2f}** | "
                  f"{med(ours, 'tokens_per_s'):.0f} | {med(layers, 'tokens_per_s'):.0f} | "
                  f"{med(cached, 'tokens_per_s'):.0f} |" + memory_columns(ours, cached))
    return 0


if __name__ == "__main__":
    sys.exit(main())
