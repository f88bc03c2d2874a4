#!/usr/bin/env python3
"""Paired runs: data-parallel ranks against threads on the same cores.

`mpirun -np 2 ./transformer train --threads 1` (two ranks, one thread each,
lab/ranks.c) against `./transformer train --threads 2` (one process, two
threads) on the same training run, alternately (ONE RANKS RANKS ONE ONE
RANKS ...: each goes first in half the pairs, so that both see the same
machine state within a pair and the drift of a shared machine cancels). The
figure of a run is the training tokens per second of train's last progress
line (--log-every = --steps: the whole run's steps, evaluation not counted),
which counts the whole batch's tokens, every rank's; the pair's figure is
ranks / one, above 1 when the ranks are faster. Prints each run and the
median ratio per config. Nothing here is used by the build or the tests.

    python3 dev/bench_ranks.py [--binary ./transformer] [--configs copy,numbers,wide]
                               [--pairs 5] [--ranks 2]

As root, Open MPI needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
(set here); --oversubscribe lets it start more ranks than cores.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from bench_compare import children_cpu_seconds, machine_busy_seconds

COMMON = "--eval-every 0 --eval-size 20 --show 0 --force"
CONFIGS = {
    # the README's copy task, its default model (toy: 2 layers, d_model 64)
    "copy": "--task copy --steps 300",
    # the numbers task on §5.1 subwords (README), 1000 merges
    "numbers": "--train tiny_data/numbers_train.tsv --bpe 1000 --steps 200",
    # a wider model: more gradients to sum a step (d_model 256, 2 + 2 layers)
    "wide": "--task copy --layers 2 --d-model 256 --d-ff 1024 --heads 4 --steps 30",
}


def tokens_per_second(command, steps):
    """(tokens/s of the run's training steps, the cores other processes kept busy meanwhile,
    train's model line)."""
    busy0, ours0, wall0 = machine_busy_seconds(), children_cpu_seconds(), time.perf_counter()
    out = subprocess.run(command, shell=True, check=True, stdout=subprocess.PIPE,
                         text=True).stdout
    busy1, ours1, wall1 = machine_busy_seconds(), children_cpu_seconds(), time.perf_counter()
    background = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (wall1 - wall0)
    lines = re.findall(r"^step +%d/%d \|.*\| +([0-9.]+)k tok/s" % (steps, steps), out, re.M)
    model = re.findall(r"^model .*", out, re.M)
    if not lines:
        sys.exit(f"error: bench_ranks.py: no progress line of step {steps} from: {command}")
    return float(lines[-1]) * 1000, background, model[0] if model else ""


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default="./transformer")
    p.add_argument("--configs", default="copy,numbers,wide")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--ranks", type=int, default=2, help="ranks, and the one process's threads")
    args = p.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    binary = os.path.abspath(args.binary)
    n = args.ranks
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs.split(","):
            run = CONFIGS[config]
            steps = int(re.search(r"--steps (\d+)", run).group(1))
            tail = f"{run} {COMMON} --log-every {steps} --checkpoint {tmp}/{config}.ckpt"
            one = f"{binary} train {tail} --threads {n}"
            ranks = f"mpirun -q --oversubscribe -np {n} {binary} train {tail} --threads 1"
            ratios, ones, rankss = [], [], []
            for pair in range(args.pairs):
                order = [("one", one), ("ranks", ranks)]
                if pair % 2:
                    order.reverse()
                got = {}
                for name, command in order:
                    got[name] = tokens_per_second(command, steps)
                ones.append(got["one"][0])
                rankss.append(got["ranks"][0])
                ratios.append(got["ranks"][0] / got["one"][0])
                if pair == 0:
                    print(f"{config}: {got['one'][2]}")
                print(f"{config} pair {pair + 1}: 1 process x {n} threads {got['one'][0]:.0f} "
                      f"tok/s (other processes {got['one'][1]:.2f} cores), {n} ranks x 1 thread "
                      f"{got['ranks'][0]:.0f} tok/s ({got['ranks'][1]:.2f}); ranks / one "
                      f"{ratios[-1]:.3f}", flush=True)
            print(f"{config}: median tok/s 1 process x {n} threads {statistics.median(ones):.0f}, "
                  f"{n} ranks x 1 thread {statistics.median(rankss):.0f}; median ranks / one "
                  f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, "
                  f"{args.pairs} pairs)", flush=True)


if __name__ == "__main__":
    main()
