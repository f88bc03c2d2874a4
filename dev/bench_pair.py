#!/usr/bin/env python3
"""Paired runs: two builds of transformer.c timed alternately on the same work.

A change to the fast path (Part II of transformer.c) stays only if it pays
(dev/PERFORMANCE.md). On a shared machine single timings drift by more than
the effects measured, so the two binaries run alternately, OLD NEW OLD NEW
..., each `./transformer bench --config C --json` in its own process, and
the figure is the median over the pairs of the ratio NEW median_ms / OLD
median_ms: below 1, NEW is faster. Both see the same machine state within a
pair, which cancels most of the drift.

    python3 dev/bench_pair.py OLD_BINARY NEW_BINARY [--configs toy,base] [--decode-configs toy]
                              [--pairs 7] [--threads 2]

Prints one line per config: the median ratio, the range of the ratios, and
each side's median time. Nothing here is used by the build or the tests.
"""
import argparse
import json
import statistics
import subprocess
import sys


def bench_ms(binary, config, decode, threads):
    cmd = [binary, "bench", "--config", config, "--json", "--threads", str(threads)]
    if decode:
        cmd.append("--decode")
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"error: bench_pair.py: no JSON line from: {' '.join(cmd)}")
    return json.loads(lines[-1])["median_ms"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--configs", default="toy,base", help="training configs, comma-separated ('' for none)")
    p.add_argument("--decode-configs", default="", help="greedy-decoding configs, comma-separated")
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    work = [(c, False) for c in args.configs.split(",") if c] + \
           [(c, True) for c in args.decode_configs.split(",") if c]
    for config, decode in work:
        old_ms, new_ms = [], []
        for _ in range(args.pairs):
            old_ms.append(bench_ms(args.old, config, decode, args.threads))
            new_ms.append(bench_ms(args.new, config, decode, args.threads))
        ratios = sorted(n / o for n, o in zip(new_ms, old_ms))
        print(f"{config:5s} {'decoding' if decode else 'training'}: new/old {statistics.median(ratios):.3f} "
              f"(range {ratios[0]:.3f}-{ratios[-1]:.3f}, {args.pairs} pairs); "
              f"old {statistics.median(old_ms):.2f} ms, new {statistics.median(new_ms):.2f} ms", flush=True)


if __name__ == "__main__":
    main()
