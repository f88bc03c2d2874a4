#!/usr/bin/python3
"""Reference files (format version 2) for many seeds, not committed, each
checked by the double and the float test programs: the evidence that the
comparison holds whatever the seed, and the measured differences from which
test_transformer.c's tolerances are set (NOTES.md sections 3 and 5).

    make test_transformer test_transformer_f64
    dev/.venv/bin/python dev/reference_seeds.py [tiny_data/*.ref]

Without arguments it makes the files in a temporary folder: the 3-layer,
d_model 40 configuration for seeds 101-106 (3.3 MB each), the two
configurations of the committed files made from seeds 89 and 42 for seeds
1-15, and the learned-positions one (committed with seed 7) for seeds 1-6.
With arguments it checks those files instead. Prints, per build and format
version, the largest difference of each quantity relative to its tensor's
largest magnitude, and for the Adam steps the largest update difference
relative to the learning rate and to the element's bound.
"""
import collections
import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_reference as mr  # noqa: E402

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
TENSOR = re.compile(r"\s+(logits|loss|grad \S+|Adam: losses|Adam: parameter updates)\s+max abs diff \S+"
                    r"\s+max rel diff (\S+)")
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
                    worst[key(q)] = max(worst[key(q)], float(m.group(2)))
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


def main(argv):
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
