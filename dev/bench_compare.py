#!/usr/bin/python3
"""`make bench`: transformer.c against PyTorch, the same training step (and greedy decoding) side by side.

For each config, runs `./transformer bench --config NAME --json` and
dev/bench_pytorch.py with the sizes transformer.c reported, in rounds
(C, then each PyTorch run, then C again, ...) so that all see the same
machine state, each in its own process with the same number of threads.
PyTorch is PyTorch 2.x from dev/.venv (make bench-setup; --python), eager and
with torch.compile, and Debian's PyTorch 1.13 (/usr/bin/python3 with
python3-torch; --system-python) when it is installed, else its columns are
left out with a note. Greedy decoding runs PyTorch 2.x's layers over the
whole prefix, the same weights with a key/value cache (bench_pytorch.py
--kv-cache, the fair match for transformer.c's cached decoding), and that
cached decoding compiled; Debian's PyTorch the cached decoding only. Then
prints a table per mode: the median over the rounds of each run's median
time, and the ratios PyTorch time / transformer.c time (above 1:
transformer.c is faster). The heading names each PyTorch's version, BLAS and
kernels (bench_pytorch.py's "blas"). dev/BENCH.md explains every column.

The machine's FMA peak is measured in the same run: dev/fma_peak.c, built
with --cc, runs with the same thread count at the start of each training
round (2 x 10^8 steps of each chain, about a second), and each config's
GFLOP/s is given as a percentage of the median of its rounds' peaks, so
that a slow phase of a shared machine slows both.

On a shared machine other processes can take the cores in the middle of a
run. Each run reports how many cores other processes used meanwhile; a round
in which any run saw more than --max-background cores of other work is
thrown away and repeated (at most --retries times). A round starts once the
other processes have used at most that for 5 s; a repeat, or a round that
saw them busier while it waited, once they have for 60 s in a row (work that
comes and goes has short pauses; waiting --quiet-wait seconds at most), and the
table's heading says how many were thrown away and the background load of
the rounds it kept.

    /usr/bin/python3 dev/bench_compare.py [--configs tiny,toy,base] [--decode-configs tiny,toy,base]
                                          [--rounds 3] [--threads 2] [--no-compile] [--cc cc]
                                          [--python dev/.venv/bin/python] [--system-python /usr/bin/python3]
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VENV_PYTHON = os.path.join(HERE, ".venv", "bin", "python")   # PyTorch 2.x, make bench-setup
SYSTEM_PYTHON = "/usr/bin/python3"                            # Debian's, with python3-torch (1.13)


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


def wait_for_quiet(limit, most, spell):
    """Waits until other processes have used at most `most` cores for 5 s, or,
    once they were seen busier or when `spell` says so, for `spell` seconds in a
    row: work that comes and goes has short pauses. Our own runs are between
    runs here. `limit` seconds at most; returns the seconds waited."""
    start = time.perf_counter()
    quiet, needed = 0.0, spell
    while True:
        busy0, wall0 = machine_busy_seconds(), time.perf_counter()
        time.sleep(5)
        load = (machine_busy_seconds() - busy0) / (time.perf_counter() - wall0)
        quiet = quiet + 5 if load <= most else 0.0
        needed = needed if load <= most else 60
        waited = time.perf_counter() - start
        if quiet >= needed or waited >= limit:
            return waited


FMA_PEAK_SOURCE = os.path.join(HERE, "fma_peak.c")
FMA_PEAK_STEPS = "200000000"   # steps of each chain: about a second on 2 cores


def build_fma_peak(cc, directory):
    """Builds dev/fma_peak.c as its comment says; returns the binary's path, or
    None with a note on stderr when the compiler fails (the table then has no
    percentages of the peak)."""
    binary = os.path.join(directory, "fma_peak")
    cmd = [cc, "-O3", "-march=native", "-funroll-loops", "-fopenmp", "-o", binary, FMA_PEAK_SOURCE]
    built = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if built.returncode != 0:
        print(f"note: {' '.join(cmd)} failed, so no FMA peak:\n{built.stdout}", file=sys.stderr)
        return None
    return binary


def fma_peak(binary, env):
    """The machine's FMA peak now, GFLOP/s for all threads together (dev/fma_peak.c's
    "... GFLOP/s in all"), with the other processes' load meanwhile, as run_json gives it."""
    busy0, ours0, wall0 = machine_busy_seconds(), children_cpu_seconds(), time.perf_counter()
    out = subprocess.run([binary, FMA_PEAK_STEPS], env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    busy1, ours1, wall1 = machine_busy_seconds(), children_cpu_seconds(), time.perf_counter()
    found = re.search(r"([0-9.]+) GFLOP/s in all", out)
    if not found:
        sys.exit(f"error: no peak in the output of {binary}: {out}")
    return {"gflops": float(found.group(1)),
            "background_load": max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (wall1 - wall0)}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def has_torch(python):
    """Whether the interpreter exists and can find a torch package (without importing it)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    try:
        return subprocess.run([python, "-c", probe], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0
    except OSError:
        return False


def short_version(v):
    """'2.15.0+cu132' -> '2.15', '1.13.0a0+git...' -> '1.13'."""
    return ".".join(v.split("+")[0].split(".")[:2])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default="./transformer")
    p.add_argument("--configs", default="tiny,toy,base", help="configs whose training step is timed")
    p.add_argument("--decode-configs", default="tiny,toy,base",
                   help="configs whose greedy decoding is timed ('' for none)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--python", default=VENV_PYTHON, help="the interpreter with PyTorch 2.x (make bench-setup)")
    p.add_argument("--system-python", default=SYSTEM_PYTHON,
                   help="the interpreter with Debian's PyTorch 1.13, timed too when it has torch ('' for none)")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile runs")
    p.add_argument("--cc", default="cc", help="the C compiler that builds dev/fma_peak.c ('' for no FMA peak)")
    p.add_argument("--max-background", type=float, default=0.1,
                   help="cores of other work above which a round is repeated")
    p.add_argument("--retries", type=int, default=5, help="repeats of one round at most")
    p.add_argument("--quiet-wait", type=float, default=600,
                   help="seconds to wait at most, before a round is repeated, for other processes to go quiet")
    a = p.parse_args(argv)
    # fail before the first run, in one line, if the interpreter of the PyTorch side has no PyTorch
    if not has_torch(a.python):
        sys.exit(f"error: dev/bench_compare.py (make bench) needs PyTorch 2.x for {a.python}: "
                 "run `make bench-setup` (dev/BENCH.md)")
    system = bool(a.system_python) and os.path.realpath(a.system_python) != os.path.realpath(a.python) \
        and has_torch(a.system_python)
    if not a.system_python:
        system_note = "Debian's PyTorch: not asked for (--system-python ''); its columns are left out"
    elif not system:
        system_note = (f"Debian's PyTorch 1.13: {a.system_python} has no torch (apt-get install python3-torch "
                       "libopenblas0-openmp); its columns are left out")
    discarded = 0
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    scratch = tempfile.TemporaryDirectory(prefix="bench_compare_")
    peak_binary = build_fma_peak(a.cc, scratch.name) if a.cc else None
    # Inductor compiles in this process rather than in a pool of worker processes,
    # whose CPU time the background-load check would count as another process's.
    compile_env = dict(env, TORCHINDUCTOR_COMPILE_THREADS="1")

    # The PyTorch runs of a round: (key, interpreter, flags), in the order they run.
    train_runs = [("eager", a.python, [])]
    decode_runs = [("layers", a.python, []), ("cached", a.python, ["--kv-cache"])]
    if not a.no_compile:
        train_runs.append(("compiled", a.python, ["--compile"]))
        decode_runs.append(("compiled", a.python, ["--kv-cache", "--compile"]))
    if system:
        train_runs.append(("system", a.system_python, []))
        decode_runs.append(("system", a.system_python, ["--kv-cache"]))

    def run_round(name, mode):
        """The machine's FMA peak (training rounds, when built), then transformer.c,
        then PyTorch, the same config: the peak (or None) and their JSON results,
        PyTorch's a dict by run (train_runs or decode_runs)."""
        flag = ["--decode"] if mode == "decode" else []
        peak = fma_peak(peak_binary, env) if peak_binary and mode == "train" else None
        c = run_json([a.binary, "bench", "--config", name, "--threads", str(a.threads), "--json"] + flag, env)
        sizes = ["--json", "--config", name, "--layers", str(c["layers"]), "--d-model", str(c["d_model"]),
                 "--d-ff", str(c["d_ff"]), "--heads", str(c["heads"]), "--vocab", str(c["vocab"]),
                 "--batch", str(c["batch"]), "--src-len", str(c["src_len"]),
                 "--tgt-len", str(c["tgt_len"]), "--dropout", str(c["dropout"]),
                 "--label-smoothing", str(c["label_smoothing"]), "--threads", str(a.threads),
                 "--warmup", str(c["warmup"]), "--steps", str(c["steps"])] + flag
        theirs = {}
        for key, python, flags in (decode_runs if mode == "decode" else train_runs):
            theirs[key] = run_json([python, os.path.join(HERE, "bench_pytorch.py")] + sizes + flags,
                                   compile_env if "--compile" in flags else env)
            if mode == "train" and abs(theirs[key]["gflop_per_step"] - c["gflop_per_step"]) > \
                    1e-3 * c["gflop_per_step"]:
                sys.exit(f"error: {name}: PyTorch ({key}) counts {theirs[key]['gflop_per_step']} GFLOP per step, "
                         f"transformer.c {c['gflop_per_step']}: the two FLOP counts must be the same")
        return peak, c, theirs

    peaks = {}   # config name: the FMA peaks measured in its training rounds kept

    def run_config(name, mode):
        """The rounds of one config; the results kept, transformer.c's and PyTorch's
        (and the peaks, in `peaks`)."""
        nonlocal discarded
        ours, theirs = [], []
        for r in range(a.rounds):
            for attempt in range(a.retries + 1):
                # a first try on a quiet machine starts after 5 s; a repeat, or a try that
                # had to wait, after a quiet minute
                waited = wait_for_quiet(a.quiet_wait, a.max_background, 5 if attempt == 0 else 60)
                if waited > 10:
                    print(f"  (waited {waited:.0f} s for the other processes to go quiet)", file=sys.stderr)
                peak, c, ts = run_round(name, mode)
                runs = ([peak] if peak else []) + [c] + list(ts.values())
                busy = max(x["background_load"] for x in runs) > a.max_background
                retry = busy and attempt < a.retries
                print(f"  {name} {mode} round {r + 1}: "
                      + (f"FMA peak {peak['gflops']:.1f} GFLOP/s, " if peak else "")
                      + f"transformer.c {c['median_ms']:.1f} ms, PyTorch "
                      + ", ".join(f"{k} {t['median_ms']:.1f} ms" for k, t in ts.items())
                      + " (other processes meanwhile: "
                      + ", ".join(f"{x['background_load']:.2f}" for x in runs) + " cores)"
                      + ("; repeating it" if retry else ""), file=sys.stderr)
                if not retry:
                    break
                discarded += 1
            ours.append(c)
            theirs.append(ts)
            if peak:
                peaks.setdefault(name, []).append(peak["gflops"])
        return name, ours, theirs

    train = [run_config(name, "train") for name in a.configs.split(",") if name]
    decode = [run_config(name, "decode") for name in a.decode_configs.split(",") if name]
    everything = train + decode
    if not everything:
        sys.exit("error: no configs to run")

    def med(results, key):
        return statistics.median(x[key] for x in results)

    def pick(theirs, key):
        """One run's results over the rounds."""
        return [ts[key] for ts in theirs]

    def size_columns(c):
        return (f"| {c['config']} | {c['layers']} | {c['d_model']} | {c['d_ff']} | {c['heads']} | {c['vocab']} | "
                f"{c['batch']} x {c['src_len']} x {c['tgt_len']} |")

    def memory(results):
        return f" {med(results, 'peak_mb'):.0f} ({med(results, 'step_mb'):.0f}) |"

    background = statistics.mean(x["background_load"] for _, o, t in everything
                                 for x in o + [y for ts in t for y in ts.values()])
    first = everything[0][2][0]
    new = first.get("eager") or first.get("layers")
    v2 = short_version(new["torch"])
    old = next((ts["system"] for _, _, t in everything for ts in t if "system" in ts), None)
    v1 = short_version(old["torch"]) if old else None
    print(f"{cpu_name()}, {os.cpu_count()} cores, {a.threads} threads; median of {a.rounds} alternating rounds, "
          f"each the median of its timed runs; other processes used {background:.2f} cores on average meanwhile"
          f"{f' ({discarded} busier rounds thrown away and repeated)' if discarded else ''}")
    print(f"- PyTorch {v2}: {new['torch']} ({os.path.relpath(new['python'])}), {new['blas']}; eager"
          + ("" if a.no_compile else ", and torch.compile (inductor): the forward pass and the loss "
             "compiled, their backward with them, Adam eager; decoding: the encoder and one position "
             "over a key/value cache of fixed length compiled; under \"first s\": the first compiled "
             "step or decoding, compilation included (less when inductor's disk cache has it)") + ".")
    print(f"- PyTorch {v1}: {old['torch']} ({old['python']}), {old['blas']}; eager" if old else f"- {system_note}")
    all_peaks = [g for name in peaks for g in peaks[name]]
    if all_peaks:
        print(f"- FMA peak (dev/fma_peak.c, {a.threads} threads, at the start of each training round): "
              f"{statistics.median(all_peaks):.1f} GFLOP/s, median of {len(all_peaks)} "
              f"({min(all_peaks):.1f}-{max(all_peaks):.1f}); each config's % of peak is its GFLOP/s over the "
              "median of its own rounds' peaks.")
    elif train:
        print("- FMA peak: not measured (--cc '' or dev/fma_peak.c did not build); no % of peak.")
    compiled = not a.no_compile
    if train:
        print("\nTraining step (forward, backward, Adam); ratios PyTorch time / transformer.c time:\n")
        cols = ["config", "N", "d_model", "d_ff", "h", "vocab", "batch (B x S x T)", "GFLOP per step",
                "transformer.c ms/step", f"PyTorch {v2} eager ms/step"]
        cols += [f"PyTorch {v2} compiled ms/step"] if compiled else []
        cols += [f"PyTorch {v1} ms/step"] if old else []
        cols += [f"{v2} eager / ours"] + ([f"{v2} compiled / ours"] if compiled else []) \
            + ([f"{v1} / ours"] if old else [])
        cols += ["ours GFLOP/s"] + (["FMA peak GFLOP/s", "ours % of peak"] if all_peaks else []) \
            + [f"{v2} eager GFLOP/s"] + ([f"{v2} compiled GFLOP/s"] if compiled else []) \
            + ([f"{v1} GFLOP/s"] if old else [])
        cols += [f"{v2} compiled first s"] if compiled else []
        cols += ["ours peak MB (step)", f"{v2} eager peak MB (step)"] \
            + ([f"{v2} compiled peak MB (step)"] if compiled else []) + ([f"{v1} peak MB (step)"] if old else [])
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for name, ours, theirs in train:
            runs = [pick(theirs, k) for k, _, _ in train_runs]
            mo = med(ours, "median_ms")
            times = [med(r, "median_ms") for r in runs]
            row = size_columns(ours[0]) + f" {ours[0]['gflop_per_step']:.2f} | {mo:.1f} |"
            row += "".join(f" {t:.1f} |" for t in times)
            row += "".join(f" **{t / mo:.2f}** |" if k in ("eager", "compiled") else f" {t / mo:.2f} |"
                           for (k, _, _), t in zip(train_runs, times))
            row += f" {med(ours, 'gflops'):.1f} |"
            if all_peaks:
                peak = statistics.median(peaks[name])
                row += f" {peak:.1f} | **{100 * med(ours, 'gflops') / peak:.0f}%** |"
            row += "".join(f" {med(r, 'gflops'):.1f} |" for r in runs)
            if compiled:
                row += f" {med(pick(theirs, 'compiled'), 'first_step_s'):.1f} |"
            row += memory(ours) + "".join(memory(r) for r in runs)
            print(row)
    if decode:
        print("\nGreedy decoding of the batch's sources, T tokens each. Ours: key/value cache. PyTorch: "
              "its layers over the whole prefix at every position (layers), the same weights one "
              "position at a time with a key/value cache (cached, dev/bench_pytorch.py --kv-cache)"
              + (", and that compiled (compiled)" if compiled else "")
              + (f"; PyTorch {v1} cached" if old else "")
              + ". Ratios PyTorch time / transformer.c time:\n")
        names = {"layers": f"PyTorch {v2} layers", "cached": f"PyTorch {v2} cached",
                 "compiled": f"PyTorch {v2} compiled cached", "system": f"PyTorch {v1} cached"}
        short = {"layers": f"{v2} layers", "cached": f"{v2} cached", "compiled": f"{v2} compiled",
                 "system": f"{v1} cached"}
        keys = [k for k, _, _ in decode_runs]
        cols = ["config", "N", "d_model", "d_ff", "h", "vocab", "batch (B x S x T)", "transformer.c ms/batch"]
        cols += [f"{names[k]} ms/batch" for k in keys]
        cols += [f"{short[k]} / ours" for k in keys]
        cols += ["ours tokens/s"] + [f"{short[k]} tokens/s" for k in keys if k != "layers"]
        cols += [f"{v2} compiled first s"] if compiled else []
        cols += ["ours peak MB (step)"] + [f"{short[k]} peak MB (step)" for k in keys if k != "layers"]
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for name, ours, theirs in decode:
            runs = {k: pick(theirs, k) for k in keys}
            mo = med(ours, "median_ms")
            row = size_columns(ours[0]) + f" {mo:.1f} |"
            row += "".join(f" {med(runs[k], 'median_ms'):.1f} |" for k in keys)
            row += "".join((" **{:.2f}** |" if k in ("cached", "compiled") else " {:.2f} |")
                           .format(med(runs[k], "median_ms") / mo) for k in keys)
            row += f" {med(ours, 'tokens_per_s'):.0f} |" + "".join(
                f" {med(runs[k], 'tokens_per_s'):.0f} |" for k in keys if k != "layers")
            if compiled:
                row += f" {med(runs['compiled'], 'first_step_s'):.1f} |"
            row += memory(ours) + "".join(memory(runs[k]) for k in keys if k != "layers")
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
