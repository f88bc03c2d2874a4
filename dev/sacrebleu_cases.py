#!/usr/bin/env python3
"""Writes lab/sacrebleu_cases.txt: generated corpora and sacreBLEU's scores of them.

lab/test_lab.c (test_bleu_against_sacrebleu) scores every corpus in the file
with lab/bleu.c, each tokenizer (none, 13a) and smoothing (none, exp, floor,
add-k, and floor and add-k with a value of their own), and checks the
score, the four precisions and the brevity penalty against the ones written
here by sacreBLEU itself, and the signature against sacreBLEU's (without its
version field). The file is written once and committed: no Python at test
time. Run again only to add cases, with the sacreBLEU named in its header:

    python3 -m venv /tmp/sb && /tmp/sb/bin/pip install sacrebleu==2.6.0
    /tmp/sb/bin/python dev/sacrebleu_cases.py > lab/sacrebleu_cases.txt

The corpora are random sentences of words, numbers and punctuation chosen to
exercise 13a's rules (periods and commas beside digits and letters, dashes
after digits, &amp; and friends, <skipped>, brackets, quotes), Unicode white
space that Python's str.split() splits at, non-ASCII letters, empty lines,
and hypotheses with no 3- or 4-gram match (where the smoothing methods
differ). Format of the file (lines split at \\n only; text is UTF-8):

    corpus INDEX LINES
    h HYPOTHESIS        (LINES times: h then r)
    r REFERENCE
    score TOK SMOOTH VALUE BLEU P1 P2 P3 P4 BP SIGNATURE    (VALUE - for none and exp)
"""
import random
import sys

import sacrebleu
from sacrebleu.metrics import BLEU

WORDS = ["the", "cat", "sat", "on", "mat", "Haus", "naïve", "日本", "über", "a", "of", "is", "it's", "don't",
         "U.S.", "e.g.", "etc", "Mr.", "3.5", "1,000", "10", "2026", "5-3", "a-b", "well-known", "--", "...",
         "&amp;", "&quot;hi&quot;", "&lt;b&gt;", "<skipped>", "(x)", "[1]", "{y}", "x/y", "50%", "$5", "#tag",
         "@you", "a+b", "=", "?", "!", "hello,", "world.", "end.", "3.", ".5", ",", ".", "-", "9-", "-9",
         "a.b", "1.2.3", "x,y", "'quoted'", "\"dq\"", "~", "^", "_", "`", "|", "\\", "café", "ß", "Ωmega"]
SPACES = [" ", " ", " ", " ", "  ", "\t", "\u00a0", "\u3000", "\u2009", "\x1c", "\x85", "\u2028", "\u200a"]


def sentence(rng, length):
    out = []
    for i in range(length):
        word = rng.choice(WORDS)
        if rng.random() < 0.15:   # glue two words or a word and punctuation
            word += rng.choice([".", ",", "-", "", ")", "&amp;", rng.choice(WORDS)])
        out.append(word)
        if i + 1 < length:
            out.append(rng.choice(SPACES))
    text = "".join(out)
    if rng.random() < 0.1:
        text = rng.choice(SPACES) + text + rng.choice([" ", "\u00a0", ""])
    return text


def hypothesis(rng, reference):
    words = reference.split()
    kind = rng.random()
    if kind < 0.1:
        return ""
    if kind < 0.25:   # few matches: no 3- or 4-grams in common, probably
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))
    out = []
    for w in words:
        r = rng.random()
        if r < 0.12:
            continue
        if r < 0.25:
            out.append(rng.choice(WORDS))
        elif r < 0.3:
            out.extend([w, rng.choice(WORDS)])
        else:
            out.append(w)
    if rng.random() < 0.2 and len(out) > 2:
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return rng.choice([" ", " ", "\u00a0"]).join(out)


COMBINATIONS = [("none", "none", None), ("none", "exp", None), ("none", "floor", None), ("none", "add-k", None),
                ("13a", "none", None), ("13a", "exp", None), ("13a", "floor", None), ("13a", "add-k", None),
                ("13a", "floor", 0.2), ("none", "add-k", 0.5)]


def main():
    rng = random.Random(2026)
    print(f"# lab/sacrebleu_cases.txt: written by dev/sacrebleu_cases.py with sacreBLEU {sacrebleu.__version__} "
          "(random seed 2026); do not edit. Format: see the script's docstring.")
    for index in range(1, 61):
        lines = rng.randint(1, 6)
        refs, hyps = [], []
        for _ in range(lines):
            ref = "" if rng.random() < 0.05 else sentence(rng, rng.randint(1, 14))
            refs.append(ref)
            hyps.append(hypothesis(rng, ref))
        print(f"corpus {index} {lines}")
        for h, r in zip(hyps, refs):
            assert "\n" not in h + r and "\r" not in h + r
            print(f"h {h}")
            print(f"r {r}")
        for tok, smooth, value in COMBINATIONS:
            bleu = BLEU(tokenize=tok, smooth_method=smooth, smooth_value=value)
            s = bleu.corpus_score(hyps, [refs])
            signature = bleu.get_signature().format().rsplit("|version:", 1)[0]
            p = " ".join(repr(float(x)) for x in s.precisions)
            print(f"score {tok} {smooth} {'-' if value is None else value} {s.score!r} {p} {s.bp!r} {signature}")


if __name__ == "__main__":
    sys.stdout.reconfigure(encoding="utf-8", newline="\n")
    main()
