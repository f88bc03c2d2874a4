#!/usr/bin/python3
"""Reference files (format version 2) for many seeds, not committed, each
checked by the double and the float test programs: the evidence that the
comparison holds whatever the seed, and the measured differences from which
test_transformer.c's tolerances are set (dev/FORMATS.md, "How the test compares").

    make test_transformer test_transformer_f64
    dev/.venv/bin/python dev/reference_seeds.py [tiny_data/*.ref]
    /usr/bin/python3 dev/reference_seeds.py --version 1 [SEED ...]

Without arguments it makes the files in a temporary folder: the 3-layer,
d_model 40 configuration for seeds 101-106 (3.3 MB each), the two
configurations of the committed files made from seeds 89 and 42 for seeds
1-15, and the learned-positions one (committed with seed 7) for seeds 1-6.
With arguments it checks those files instead. Prints, per build and format
version, the largest difference of each quantity relative to its tensor's
largest magnitude, and for the Adam steps the largest update difference
relative to the learning rate and to the element's bound.

--version 1 writes version 1 files (PyTorch's float32 Adam run free over the
steps) on the given seeds (default: 201-210, used nowhere else) for each of
V1_CONFIGS (the four above and the committed version 1 file's, each with its
own steps, and ref_1layer_4head's with one step, as ref_v1_one_step.ref), and
for each the same options in version 2 (PyTorch in float64), to print how far
PyTorch's own float32 run is from its float64 run; then checks the version 1
files with both builds (dev/FORMATS.md, "Reference files", has the result).
"""
import collections
import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_reference as mr  # noqa: E402
import read_reference as rr  # noqa: E402

CONFIGS = [
    ("d40", "--layers 3 --d-model 40 --d-ff 64 --heads 5 --vocab 23 --max-len 16 --batch 3 "
            "--src-len 7 --tgt-len 6 --adam-steps 3 --warmup 4", range(101, 107)),
    ("2layer_5head", "--layers 2 --d-model 10 --d-ff 16 --heads 5 --vocab 13 --max-len 8 --batch 3 "
                     "--src-len 6 --tgt-len 5 --adam-steps 2 --warmup 2", range(1, 16)),
    ("1layer_4head", "--layers 1 --d-model 16 --d-ff 16 --heads 4 --vocab 11 --max-len 8 --batch 3 "
                     "--src-len 5 --tgt-len 6 --adam-steps 2 --warmup 2", range(1, 16)),
    ("learned", "--positional learned --layers 2 --d-model 24 --d-ff 40 --heads 4 --vocab 19 --max-len 16 "
                "--batch 3 --src-len 7 --tgt-len 6 --adam-steps 3 --warmup 4", range(1, 7)),
]
V1_CONFIGS = CONFIGS + [   # --version 1: the seeds are V1_SEEDS, not the ranges
    ("1layer_3head_v1", "--layers 1 --d-model 18 --d-ff 20 --heads 3 --vocab 11 --max-len 12 --batch 2 "
                        "--src-len 5 --tgt-len 8 --label-smoothing 0.0 --ln-eps 1e-6 --adam-steps 4 --warmup 2 "
                        "--lr-factor 2.0", None),
    ("1layer_4head_1step", "--layers 1 --d-model 16 --d-ff 16 --heads 4 --vocab 11 --max-len 8 --batch 3 "
                           "--src-len 5 --tgt-len 6 --adam-steps 1 --warmup 2", None),
]
V1_SEEDS = range(201, 211)
TENSOR = re.compile(r"\s+(logits|loss|grad \S+|Adam: losses|Adam: parameter updates|Adam: losses, steps \S+"
                    r"|Adam: updates, \d+ steps)\s+max abs diff \S+\s+max rel diff (\S+)")
FREE = re.compile(r"\s+Adam: updates, .* max diff / \(2 sum lr_k rho_k = \S+\) (\S+)")
STEP = re.compile(r"\s+Adam step \d .*= (\S+) lr, max diff/bound (\S+) \((\S+) where not capped\); "
                  r"(\d+) of (\d+)")


def check(paths):
    worst = collections.defaultdict(float)
    failures = []
    for build in ("./test_transformer_f64", "./test_transformer"):
        for path in paths:
            with open(path, "rb") as f:
                version = int.from_bytes(f.read(8)[4:], "little")
            run = subprocess.run([build, "--reference", path], capture_output=True, text=True,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
            if run.returncode != 0:
                failures.append(f"{build} {path}")
            key = lambda q: (build, version, q)  # noqa: E731
            for line in run.stdout.splitlines():
                m = TENSOR.match(line)
                if m:
                    q = "gradients" if m.group(1).startswith("grad ") else m.group(1)
                    q = re.sub(r"steps 2\.\.\d+|\d+ steps", "free steps", q)   # version 1, reported
                    worst[key(q)] = max(worst[key(q)], float(m.group(2)))
                m = FREE.match(line)
                if m:
                    worst[key("update diff / 2 sum lr rho")] = max(worst[key("update diff / 2 sum lr rho")],
                                                                   float(m.group(1)))
                m = STEP.match(line)
                if m:
                    for q, v in (("update diff / lr", float(m.group(1))),
                                 ("update diff / bound", float(m.group(2))),
                                 ("  where not capped", float(m.group(3))),
                                 ("bounds above lr/100", int(m.group(4)) / int(m.group(5)))):
                        worst[key(q)] = max(worst[key(q)], v)
    for (build, version, q), v in sorted(worst.items()):
        print(f"{build:24s} version {version}  {q:24s} {v:.3e}")
    print(f"{len(paths)} files, {len(failures)} failed" + "".join("\n  FAIL " + f for f in failures))
    return 1 if failures else 0


def pytorch_f32_f64(v1_path, v2_path):
    """PyTorch's float32 run (a version 1 file) against its float64 run (the
    version 2 file of the same options): the steps K, and the largest
    differences of the step losses 2..K (relative to the largest) and of the
    updates after the last step (relative to the largest update, the key
    biases left out)."""
    h1, f1 = rr.parse(v1_path)
    h2, f2 = rr.parse(v2_path)
    P, K = f1["P"], h1["adam_steps"]
    kb = rr.key_bias_mask(h1, f1)
    losses = np.abs(f1["step_losses"][1:].astype(np.float64) - f2["step_losses"][1:])
    losses = float(losses.max() / np.abs(f2["step_losses"][1:]).max()) if K > 1 else 0.0
    ours = f1["params_after"].astype(np.float64) - f1["params"]
    theirs = f2["params_after"][(K - 1) * P:] - f2["params"]
    return K, losses, float(np.abs(ours - theirs)[~kb].max() / np.abs(theirs[~kb]).max())


def version1(seeds):
    with tempfile.TemporaryDirectory() as folder:
        paths, worst = [], collections.defaultdict(float)
        for name, options, _ in V1_CONFIGS:
            for seed in seeds:
                path = os.path.join(folder, f"{name}_{seed}.ref")
                twin = os.path.join(folder, f"{name}_{seed}_f64.ref")
                with contextlib.redirect_stdout(io.StringIO()):
                    mr.main(options.split() + ["--seed", str(seed), "--version", "1", "--out", path])
                    mr.main(options.split() + ["--seed", str(seed), "--version", "2", "--out", twin])
                K, losses, updates = pytorch_f32_f64(path, twin)
                which = "updates after the last step" if K > 1 else "updates, one step"
                worst["step losses 2..K"] = max(worst["step losses 2..K"], losses)
                worst[which] = max(worst[which], updates)
                os.remove(twin)
                paths.append(path)
        print(f"PyTorch float32 against float64, {len(paths)} files (relative; the updates without the key biases): "
              + ", ".join(f"{q} {v:.3e}" for q, v in sorted(worst.items())))
        return check(paths)


def main(argv):
    if argv[:2] == ["--version", "1"]:
        return version1([int(x) for x in argv[2:]] or V1_SEEDS)
    if argv:
        return check(argv)
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for name, options, seeds in CONFIGS:
            for seed in seeds:
                path = os.path.join(folder, f"{name}_{seed}.ref")
                with contextlib.redirect_stdout(io.StringIO()):
                    mr.main(options.split() + ["--seed", str(seed), "--out", path])
                paths.append(path)
        return check(paths)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
