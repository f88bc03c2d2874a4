#!/usr/bin/python3
"""`make bench`: transformer.c against PyTorch, the same training step side by side.

For each config, runs `./transformer bench --config NAME --json` and
dev/bench_pytorch.py with the sizes transformer.c reported, alternating
(C, PyTorch, C, PyTorch, ...) so that both see the same machine state, each in
its own process with the same number of threads. Then prints one table: the
median over the rounds of each side's median step time, and the ratio
PyTorch time / transformer.c time (above 1: transformer.c is faster).

    /usr/bin/python3 dev/bench_compare.py [--configs tiny,toy,base] [--rounds 3] [--threads 2]
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
    p.add_argument("--configs", default="tiny,toy,base")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    rows = []
    for name in a.configs.split(","):
        ours, theirs = [], []
        for r in range(a.rounds):
            c = run_json([a.binary, "bench", "--config", name, "--threads", str(a.threads), "--json"], env)
            ours.append(c)
            t = run_json(["/usr/bin/python3", os.path.join(HERE, "bench_pytorch.py"), "--json",
                          "--config", name, "--layers", str(c["layers"]), "--d-model", str(c["d_model"]),
                          "--d-ff", str(c["d_ff"]), "--heads", str(c["heads"]), "--vocab", str(c["vocab"]),
                          "--batch", str(c["batch"]), "--src-len", str(c["src_len"]),
                          "--tgt-len", str(c["tgt_len"]), "--dropout", str(c["dropout"]),
                          "--label-smoothing", str(c["label_smoothing"]), "--threads", str(a.threads),
                          "--warmup", str(c["warmup"]), "--steps", str(c["steps"])], env)
            theirs.append(t)
            print(f"  {name} round {r + 1}: transformer.c {c['median_ms']:.1f} ms, "
                  f"PyTorch {t['median_ms']:.1f} ms (other processes meanwhile: "
                  f"{c['background_load']:.2f} and {t['background_load']:.2f} cores)", file=sys.stderr)
        rows.append((name, ours, theirs))

    def med(results, key):
        return statistics.median(x[key] for x in results)

    background = statistics.mean(x["background_load"] for _, o, t in rows for x in o + t)
    print(f"{cpu_name()}, {os.cpu_count()} cores, {a.threads} threads; PyTorch {rows[0][2][0]['torch']}; "
          f"median of {a.rounds} alternating rounds, each the median of its timed steps; "
          f"other processes used {background:.2f} cores on average meanwhile")
    print("| config | N | d_model | d_ff | h | vocab | batch (B x S x T) | transformer.c ms/step | "
          "PyTorch ms/step | PyTorch / ours | ours tokens/s | PyTorch tokens/s | ours GFLOP/s | "
          "PyTorch GFLOP/s | ours peak MB (step) | PyTorch peak MB (step) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, ours, theirs in rows:
        c = ours[0]
        mo, mt = med(ours, "median_ms"), med(theirs, "median_ms")
        print(f"| {name} | {c['layers']} | {c['d_model']} | {c['d_ff']} | {c['heads']} | {c['vocab']} | "
              f"{c['batch']} x {c['src_len']} x {c['tgt_len']} | {mo:.1f} | {mt:.1f} | "
              f"**{mt / mo:.2f}** | {med(ours, 'tokens_per_s'):.0f} | {med(theirs, 'tokens_per_s'):.0f} | "
              f"{med(ours, 'gflops'):.1f} | {med(theirs, 'gflops'):.1f} | "
              f"{med(ours, 'peak_mb'):.0f} ({med(ours, 'step_mb'):.0f}) | "
              f"{med(theirs, 'peak_mb'):.0f} ({med(theirs, 'step_mb'):.0f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
