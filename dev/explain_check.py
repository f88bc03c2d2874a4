#!/usr/bin/python3
"""explain's page against decode, on a trained model's test sentences: the
output a page holds (its JSON, "output"."text") must be decode's line for the
same sentence, greedy and beam search.

    python3 dev/explain_check.py runs/translate/de/average.ckpt runs/translate/de/test.source
    python3 dev/explain_check.py CKPT SOURCE --count 20 --beam 4 --binary ./transformer

For each of the first --count lines of SOURCE: ./transformer decode reads the
line on standard input (greedy, then --beam B with alpha 0.6, one thread, as
make translate decodes) and ./transformer explain reads the same line the
same way (a catalog sentence may begin with '-'), writing a page to a
temporary folder; the script reads the page's numbers back as JSON (json.loads
of the <script id="explain-data"> element: the escaping of '<', U+2028 and
U+2029 is JSON's own) and compares. Prints one line per difference and a
summary; exit status 1 when any differs. The C tests check the same on the
small models of make test (lab/test_lab.c, test_explain_command); this is the
check on a real model, run by hand (not part of make test or dev/check.sh: it
needs a trained model).

Recorded (2026-12-06, the catalogs model of make translate, English -> German,
2 layers, d_model 256, 3000 merges; 2 cores):
    python3 dev/explain_check.py /work/main/runs/translate/de/average.ckpt \
        /work/main/runs/translate/de/test.source --count 20
    greedy: 20 of 20 pages hold decode's output
    beam 4: 20 of 20 pages hold decode's output
(18.6 s; 15 of the 20 sentences begin with '-', and greedy and beam 4 decode
16 of the 20 differently, so both searches are compared on their own outputs.)
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile


def decode(binary, ckpt, line, beam):
    """decode's output line for one line on standard input."""
    args = [binary, "decode", "--checkpoint", ckpt, "--threads", "1"]
    if beam > 1:
        args += ["--beam", str(beam), "--alpha", "0.6"]
    run = subprocess.run(args, input=line + "\n", capture_output=True, text=True, check=True)
    return run.stdout.rstrip("\n")


def explain(binary, ckpt, line, beam, page):
    """The output text in the page explain writes for one line on standard input."""
    args = [binary, "explain", "--checkpoint", ckpt, "--threads", "1", "--out", page]
    if beam > 1:
        args += ["--beam", str(beam), "--alpha", "0.6"]
    subprocess.run(args, input=line + "\n", capture_output=True, text=True, check=True)
    with open(page, encoding="utf-8") as f:
        html = f.read()
    found = re.search(r'<script type="application/json" id="explain-data">\n(.*?)</script>',
                      html, re.S)
    if not found:
        raise SystemExit(f"{page}: no explain-data script in the page")
    return json.loads(found.group(1))["output"]["text"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("source", help="one sentence a line (test.source)")
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--binary", default="./transformer")
    a = parser.parse_args()
    with open(a.source, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f][:a.count]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "explain.html")
        for beam, name in ((1, "greedy"), (a.beam, f"beam {a.beam}")):
            same = 0
            for i, line in enumerate(lines):
                decoded = decode(a.binary, a.checkpoint, line, beam)
                shown = explain(a.binary, a.checkpoint, line, beam, page)
                if shown == decoded:
                    same += 1
                else:
                    print(f"{a.source}:{i + 1}: {name}: decode {decoded!r}, the page {shown!r}")
            print(f"{name}: {same} of {len(lines)} pages hold decode's output")
            failed += len(lines) - same
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
