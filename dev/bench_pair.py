#!/usr/bin/env python3
"""Paired runs: two builds of transformer.c timed alternately on the same work.

A change to the fast path (lab/fast_path.c) stays only if it pays
(dev/PERFORMANCE.md). On a shared machine single timings drift by more than
the effects measured, so the two binaries run alternately, OLD NEW NEW OLD
OLD NEW ..., each `./transformer bench --config C --json` in its own
process, and the figure is the median over the pairs of the ratio NEW /
OLD: below 1, NEW is faster. Both see the same machine state within a pair,
which cancels most of the drift, and each goes first in half the pairs:
with OLD always first, ./transformer against itself gave base 0.936 (9
pairs, Zen 3 guest; dev/PERFORMANCE.md), as large as the effects measured.
Two ratios are printed: of each run's median step time (median_ms, what
make bench reports) and of its fastest step (min_ms). On a machine shared
with other virtual machines a run's median moves by 10-20%
from run to run while its fastest step moves by 2-5%; the fastest step is
the binary's speed when nothing else interferes, and the better figure for
deciding whether a change pays.

    python3 dev/bench_pair.py OLD_BINARY NEW_BINARY [--configs toy,base] [--decode-configs toy]
                              [--pairs 7] [--threads 2]

A pair in which other processes took more than --max-background cores
during either run (read from /proc/stat, as dev/bench_compare.py does) is
thrown away and run again, at most --retries times in all. --wait-quiet S
starts each pair only once the other processes have used at most that for S
seconds in a row (checked every second), for a machine whose quiet spells
are short and far apart; with a large --retries such a run can take hours.

Prints one line per config: the two median ratios, their ranges, and each
side's times. Nothing here is used by the build or the tests.

--cpu adds a third ratio, of the CPU time per step (cpu_ms), and lets every
pair count whatever the other processes did: for a machine too busy for
quiet pairs. A thread's CPU time does not count the time it waits while
other processes run, as its wall time does (what it still counts: the caches
the others took, and time the hypervisor takes). With two threads, run it
under OMP_WAIT_POLICY=passive (the environment passes to both binaries), so
that a thread waiting at a barrier sleeps instead of spinning, which would
count as CPU time. Measured on a machine with other developers' builds and
tests on both cores: still 0.65-1.3 from pair to pair, so many pairs.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def machine_busy_seconds():
    """CPU time the whole machine has spent busy (all processes), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def bench_ms(binary, config, decode, threads):
    """(median_ms, min_ms, background cores, cpu_ms) of one run of `binary bench`."""
    cmd = [binary, "bench", "--config", config, "--json", "--threads", str(threads)]
    if decode:
        cmd.append("--decode")
    busy0, ours0, wall0 = machine_busy_seconds(), children_cpu_seconds(), time.perf_counter()
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    busy1, ours1, wall1 = machine_busy_seconds(), children_cpu_seconds(), time.perf_counter()
    background = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (wall1 - wall0)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"error: bench_pair.py: no JSON line from: {' '.join(cmd)}")
    result = json.loads(lines[-1])
    return result["median_ms"], result["min_ms"], background, result["cpu_ms"]


def wait_for_quiet(seconds, most):
    """Returns once the other processes have used at most `most` cores for
    `seconds` seconds in a row (this script runs nothing meanwhile)."""
    quiet = 0
    while quiet < seconds:
        busy0, wall0 = machine_busy_seconds(), time.perf_counter()
        time.sleep(1)
        load = (machine_busy_seconds() - busy0) / (time.perf_counter() - wall0)
        quiet = quiet + 1 if load <= most else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--configs", default="toy,base", help="training configs, comma-separated ('' for none)")
    p.add_argument("--decode-configs", default="", help="greedy-decoding configs, comma-separated")
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-background", type=float, default=0.25,
                   help="cores of other work allowed during a run before its pair is run again")
    p.add_argument("--retries", type=int, default=10)
    p.add_argument("--wait-quiet", type=int, default=0, metavar="S",
                   help="start each pair after S seconds in a row of at most --max-background cores of other work")
    p.add_argument("--cpu", action="store_true",
                   help="also the ratio of CPU time per step, and no pair run again for the others' load")
    args = p.parse_args()
    work = [(c, False) for c in args.configs.split(",") if c] + \
           [(c, True) for c in args.decode_configs.split(",") if c]
    for config, decode in work:
        old_ms, new_ms, retries = [], [], 0
        while len(old_ms) < args.pairs:
            if args.wait_quiet:
                wait_for_quiet(args.wait_quiet, args.max_background)
            if len(old_ms) % 2 == 0:   # OLD first in even pairs, NEW first in odd ones
                old = bench_ms(args.old, config, decode, args.threads)
                new = bench_ms(args.new, config, decode, args.threads)
            else:
                new = bench_ms(args.new, config, decode, args.threads)
                old = bench_ms(args.old, config, decode, args.threads)
            if not args.cpu and max(old[2], new[2]) > args.max_background and retries < args.retries:
                retries += 1
                time.sleep(2)
                continue
            old_ms.append(old)
            new_ms.append(new)
        background = statistics.mean(x[2] for x in old_ms + new_ms)
        line = (f"{config:5s} {'decoding' if decode else 'training'}, {args.pairs} pairs ({retries} run again; "
                f"other processes {background:.2f} cores):")
        for k, name in ((0, "median"), (1, "fastest")) + (((3, "CPU time"),) if args.cpu else ()):
            ratios = sorted(n[k] / o[k] for n, o in zip(new_ms, old_ms))
            line += (f"  {name} step new/old {statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f}; "
                     f"old {statistics.median(o[k] for o in old_ms):.2f} ms, "
                     f"new {statistics.median(n[k] for n in new_ms):.2f} ms)")
        print(line, flush=True)


if __name__ == "__main__":
    main()
