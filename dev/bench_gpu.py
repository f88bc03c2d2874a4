#!/usr/bin/python3
"""`make test-cuda`: ./transformer_cuda against PyTorch on the same GPU, the same training steps.

For each config (tiny, toy, base: ./transformer bench's), runs
`./transformer_cuda bench --config NAME --json` and dev/bench_pytorch.py
--device cuda with the same sizes, eager and with torch.compile, in rounds
(ours, eager, compiled, ours, ...) each in its own process, and prints a
Markdown table: the median over the rounds of each run's median step time,
target tokens per second, and PyTorch's time over ours (above 1: ours is
faster), headed by the GPU's name and the date. Both multiply in fp32 (TF32
off); PyTorch's Adam is its default on a GPU (foreach: its multi-tensor kernels).

PyTorch comes from --python (make test-cuda passes dev/.venv's interpreter when
it imports torch, else the first python3 on the PATH that does); with none,
--python '' prints ours alone and one line saying why PyTorch is missing. A
torch.compile run that fails (no Triton, say) shows as "failed" with its first
error line, and the table goes on.

    dev/bench_gpu.py [--binary ./transformer_cuda] [--configs tiny,toy,base] [--rounds 3]
                     [--python PYTHON] [--no-compile]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = ("layers", "d_model", "d_ff", "heads", "vocab", "batch", "src_len", "tgt_len")


def run_json(cmd):
    """Runs one benchmark: its JSON line, or the first error line as {"error": ...}."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    errors = [line for line in done.stderr.splitlines() if "Error" in line or "error" in line]
    return {"error": (errors or done.stderr.splitlines() or ["exit status %d" % done.returncode])[-1][:120]}


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             stdout=subprocess.PIPE, text=True, check=True).stdout
        return out.splitlines()[0].strip()
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown GPU (no nvidia-smi)"


def torch_command(python, ours, name, compiled):
    cmd = [python, os.path.join(HERE, "bench_pytorch.py"), "--device", "cuda", "--config", name, "--json",
           "--dropout", str(ours["dropout"]), "--label-smoothing", str(ours["label_smoothing"]),
           "--warmup", str(ours["warmup"]), "--steps", str(ours["steps"])]
    for size in SIZES:
        cmd += ["--" + size.replace("_", "-"), str(ours[size])]
    return cmd + (["--compile"] if compiled else [])


def median_of(results, key):
    values = [r[key] for r in results if key in r]
    return statistics.median(values) if values else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default="./transformer_cuda")
    p.add_argument("--configs", default="tiny,toy,base")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--python", default="", help="the interpreter whose PyTorch is timed ('': none)")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile runs")
    a = p.parse_args(argv)
    kinds = ["eager"] + ([] if a.no_compile else ["compile"])
    print(f"## Training step on {gpu_name()}, {datetime.date.today().isoformat()}\n")
    if not a.python:
        print("PyTorch: skipped, no python3 here imports torch (make bench-setup builds dev/.venv where PyPI "
              "is reachable)\n")
        kinds = []
    rows = []
    for name in a.configs.split(","):
        runs = {"ours": [], **{k: [] for k in kinds}}
        for _ in range(a.rounds):
            ours = run_json([a.binary, "bench", "--config", name, "--json"])
            if "error" in ours:
                sys.exit(f"error: {a.binary} bench --config {name}: {ours['error']}")
            runs["ours"].append(ours)
            for k in kinds:
                runs[k].append(run_json(torch_command(a.python, ours, name, k == "compile")))
        rows.append((name, runs))
    versions = {r.get("torch") for _, runs in rows for k in kinds for r in runs[k] if "torch" in r}
    adams = {r.get("adam") for _, runs in rows for k in kinds for r in runs[k] if "adam" in r}
    if kinds:
        print(f"PyTorch {', '.join(sorted(versions)) or '(no run succeeded)'}, Adam {', '.join(sorted(adams)) or '?'}; "
              f"fp32, TF32 off; medians of {a.rounds} rounds; ratio = PyTorch's time / ours (above 1: ours faster)\n")
    header = "| config | ours ms | ours tokens/s |" + "".join(f" {k} ms | {k} tokens/s | {k} ratio |" for k in kinds)
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name, runs in rows:
        ours_ms, ours_tps = median_of(runs["ours"], "median_ms"), median_of(runs["ours"], "tokens_per_s")
        cells = [name, f"{ours_ms:.2f}", f"{ours_tps:.0f}"]
        for k in kinds:
            ms, tps = median_of(runs[k], "median_ms"), median_of(runs[k], "tokens_per_s")
            if ms is None:
                failed = next((r["error"] for r in runs[k] if "error" in r), "no result")
                cells += ["failed", failed.replace("|", "/"), ""]
            else:
                cells += [f"{ms:.2f}", f"{tps:.0f}", f"{ms / ours_ms:.2f}"]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
