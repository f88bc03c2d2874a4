#!/usr/bin/python3
"""Training on a busy machine (issue 28): `./transformer train` alone, then beside
a busy neighbour, in alternating rounds, and the ratio of the two speeds.

Neighbours: `train` (a second ./transformer train with 2 threads, the
default-sized copy task, run for the whole measurement), `train:0` (the same
with the default thread count) and `yes` (yes > /dev/null, one busy core);
`+session` after a name starts it in a session of its own, as a program
started from another terminal is (Linux's sched_autogroup then shares CPU time
between sessions, not threads). Each measured run trains the toy or base model's
sizes on the copy task with the default thread count (or --threads), and its
speed is the median target tokens/s of its --log lines after the first (the
training steps alone: evaluation is not timed there). The ratio idle / busy is
how many times slower training is beside the neighbour.

    dev/bench_busy.py [--binary ./transformer] [--configs toy,base] [--neighbours train,yes,train+session,yes+session]
                      [--rounds 3] [--threads 0] [--extra '...']
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = {
    # the sizes of ./transformer bench's toy and base (the copy task's 14 tokens as vocabulary)
    "toy": "--layers 2 --d-model 128 --d-ff 512 --heads 4 --batch-tokens 2048 --steps 60 --log-every 5",
    "base": "--layers 6 --d-model 512 --d-ff 2048 --heads 8 --batch-tokens 1024 --steps 16 --log-every 2",
}
COMMON = "--task copy --max-length 30 --warmup 4000 --eval-every 0 --eval-size 10 --show 0 --force"


def run_train(binary, config, threads, extra, folder):
    log = os.path.join(folder, "log.csv")
    if os.path.exists(log):
        os.remove(log)
    cmd = [binary, "train"] + (COMMON + " " + CONFIGS[config] + " " + extra).split() + [
        "--threads", str(threads), "--log", log, "--checkpoint", os.path.join(folder, "run.ckpt")]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit("bench_busy: %s failed:\n%s" % (" ".join(cmd), done.stdout[-2000:]))
    rates = [float(line.split(",")[3]) for line in open(log) if line[0].isdigit()]
    notes = [line for line in done.stdout.splitlines() if line.startswith("note")]
    return statistics.median(rates[1:]), notes


def start_neighbour(kind, binary, folder):
    """kind: yes or train (--threads 2); "train:0" a train with the default thread count;
    "+session" at the end starts it in a session of its own, as from another terminal (where the
    kernel groups each session's threads, sched_autogroup, CPU time is shared by session)."""
    session = kind.endswith("+session")
    kind = kind.replace("+session", "")
    if kind == "yes":
        cmd = ["yes"]
    else:
        threads = kind.split(":")[1] if ":" in kind else "2"
        cmd = [binary, "train", "--task", "copy", "--threads", threads, "--steps", "100000000", "--eval-every",
               "0", "--log-every", "0", "--show", "0", "--force", "--checkpoint", os.path.join(folder, "neighbour.ckpt")]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=session)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default="./transformer")
    p.add_argument("--configs", default="toy,base")
    p.add_argument("--neighbours", default="train,yes")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="the measured runs' --threads (0: the default)")
    p.add_argument("--extra", default="", help="more options for the measured runs")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        print("| config | neighbour | idle tokens/s | busy tokens/s | idle / busy | notes |")
        print("|---|---|---|---|---|---|")
        for config in a.configs.split(","):
            for kind in a.neighbours.split(","):
                idle, busy, notes = [], [], set()
                for _ in range(a.rounds):
                    idle.append(run_train(a.binary, config, a.threads, a.extra, folder)[0])
                    neighbour = start_neighbour(kind, a.binary, folder)
                    time.sleep(1.0)
                    try:
                        rate, said = run_train(a.binary, config, a.threads, a.extra, folder)
                    finally:
                        neighbour.kill()
                        neighbour.wait()
                    busy.append(rate)
                    notes.update(note[:60] for note in said)
                i, b = statistics.median(idle), statistics.median(busy)
                ratios = " ".join("%.2f" % (x / y) for x, y in zip(idle, busy))
                print("| %s | %s | %.0f | %.0f | %.2f (%s) | %s |" % (config, kind, i, b, i / b, ratios,
                                                                    "; ".join(sorted(notes))), flush=True)


if __name__ == "__main__":
    main()
