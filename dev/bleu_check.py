#!/usr/bin/python3
"""Corpus BLEU of the test cases in test_transformer.c, computed independently;
and `./transformer bleu` against sacreBLEU on random corpora.

    /usr/bin/python3 dev/bleu_check.py
    dev/.venv/bin/python dev/bleu_check.py --sacrebleu ./transformer   # needs pip install sacrebleu

Two computations that share no code with transformer.c: a short one of our own
below (collections.Counter, the textbook definition), and NLTK's corpus_bleu
(Debian's python3-nltk; skipped if it is not installed). Both print BLEU on
the 0..100 scale, with the four n-gram precisions and the brevity penalty.
The C tests hold the numbers this prints (the definition: NOTES.md, "The program";
the bleu command: lab/NOTES.md, "BLEU of files").

--sacrebleu BINARY writes random corpora (a few hundred sentence pairs each,
0 to 30 tokens, short ones included, from small vocabularies so that n-grams
match), scores them with `BINARY bleu HYP REF --tokenize T --smooth S` for
each tokenizer (none, 13a) and smoothing (none, exp, floor, add-k) and with
sacreBLEU's corpus_bleu(tokenize=T, smooth_method=S), and checks that the two
agree to 2 decimals; then that bleu's defaults are sacreBLEU's. (The test
with every digit: lab/sacrebleu_cases.txt, dev/sacrebleu_cases.py.)
"""
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import warnings
from collections import Counter

# (name, [(candidate, reference), ...]) -- the same strings as the C tests
CASES = [
    ("identical", [("the cat sat on the mat", "the cat sat on the mat")]),
    ("shorter candidate", [("the cat sat on", "the cat sat on the mat")]),
    ("no 4-gram matches", [("a b c e d", "a b c d e")]),
    ("clipping", [("the the the the the the the", "the cat is on the mat")]),
    ("clipping, short", [("the the the the", "the cat")]),
    ("two sentences", [("a b c d", "a b c d"), ("e f g x i", "e f g h i")]),
    ("two sentences, one short", [("a b c d e f g h", "a b c d e f g h"), ("p q r", "p q r s t u")]),
]


def ngrams(tokens, n):
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def corpus_bleu_own(pairs, nltk_denominators=False):
    """nltk_denominators: count a sentence with no n-grams of order n as having
    one (NLTK's max(1, .) in modified_precision), to show that this is the
    only difference where the two disagree."""
    matches, totals, c, r = [0] * 4, [0] * 4, 0, 0
    for candidate, reference in pairs:
        cand, ref = candidate.split(), reference.split()
        c += len(cand)
        r += len(ref)
        for n in range(1, 5):
            cand_grams, ref_grams = ngrams(cand, n), ngrams(ref, n)
            matches[n - 1] += sum(min(k, ref_grams[g]) for g, k in cand_grams.items())
            grams = max(len(cand) - n + 1, 0)
            totals[n - 1] += max(grams, 1) if nltk_denominators else grams
    precisions = [m / t if t else 0.0 for m, t in zip(matches, totals)]
    bp = 1.0 if c > r else math.exp(1 - r / c)
    bleu = 0.0 if min(precisions) == 0 else bp * math.exp(sum(math.log(p) for p in precisions) / 4)
    return 100 * bleu, precisions, bp


def corpus_bleu_nltk(pairs):
    try:
        from nltk.translate.bleu_score import corpus_bleu
    except ImportError:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NLTK warns when a precision is 0 (and returns 0)
        return 100 * corpus_bleu([[ref.split()] for _, ref in pairs], [cand.split() for cand, _ in pairs])


def main():
    for name, pairs in CASES:
        bleu, precisions, bp = corpus_bleu_own(pairs)
        nltk = corpus_bleu_nltk(pairs)
        shown = " ".join(f"{p:.10f}" for p in precisions)
        print(f"{name:26s} BLEU {bleu:.10f}  NLTK {'-' if nltk is None else f'{nltk:.10f}'}"
              f"  p1..p4 {shown}  BP {bp:.10f}")
        if nltk is not None and abs(nltk - bleu) > 1e-9:
            as_nltk = corpus_bleu_own(pairs, nltk_denominators=True)[0]
            print(f"{'':26s} differs from NLTK: NLTK counts a candidate shorter than n as having one"
                  f" n-gram; so counted, ours gives {as_nltk:.10f}")
            assert abs(nltk - as_nltk) < 1e-9, (name, nltk, as_nltk)
    averaged = sum(corpus_bleu_own([pair])[0] for pair in CASES[5][1]) / 2
    print(f"mean of the sentence BLEUs of 'two sentences': {averaged:.10f}")


def random_corpus(rng, sentences):
    """Hypothesis and reference lines: a reference of 0..30 tokens (a quarter of
    them 0..3), and a hypothesis that is the reference with some tokens
    changed, dropped or added, or an unrelated sentence."""
    vocabulary = [f"w{i}" for i in range(rng.choice([5, 20, 200]))] + ["der", "Haus", "é", "--", "."]
    hyps, refs = [], []
    for _ in range(sentences):
        length = rng.randint(0, 3) if rng.random() < 0.25 else rng.randint(4, 30)
        ref = [rng.choice(vocabulary) for _ in range(length)]
        if rng.random() < 0.1:
            hyp = [rng.choice(vocabulary) for _ in range(rng.randint(0, 30))]
        else:
            hyp = []
            for token in ref:
                r = rng.random()
                if r < 0.1:
                    continue                              # dropped
                hyp.append(rng.choice(vocabulary) if r < 0.25 else token)
                if rng.random() < 0.05:
                    hyp.append(rng.choice(vocabulary))    # added
        # white space as a user's files may have it: runs of spaces, tabs, ends, and now and then
        # the other characters Python's str.split() splits at (no-break and ideographic spaces,
        # U+2003, U+2028, U+0085, the separators U+001C..U+001F, vertical tab, form feed)
        other = ["\u00a0", "\u3000", "\u2003", "\u2028", "\u0085", "\x1c", "\x1f", "\x0b", "\x0c", "\u202f"]
        spaces = lambda: rng.choice([" ", " ", " ", "  ", "\t", rng.choice(other)])
        hyps.append(spaces().join(hyp) + (" " if rng.random() < 0.1 else ""))
        refs.append(spaces().join(ref))
    return hyps, refs


def binary_bleu(binary, hyps, refs, directory, flags=()):
    hyp_path, ref_path = os.path.join(directory, "hyp.txt"), os.path.join(directory, "ref.txt")
    for path, lines in ((hyp_path, hyps), (ref_path, refs)):
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
    out = subprocess.run([binary, "bleu", hyp_path, ref_path, *flags], capture_output=True, text=True,
                         check=True).stdout
    return float(re.search(r"^BLEU\|\S* = ([0-9.]+)", out, re.M).group(1))


def check_sacrebleu(binary, corpora=20, sentences=300):
    """`BINARY bleu` with each --tokenize and --smooth against sacreBLEU's corpus_bleu, to 2 decimals."""
    import sacrebleu
    rng = random.Random(2017)
    worst = 0.0
    with tempfile.TemporaryDirectory() as directory:
        for corpus in range(corpora):
            hyps, refs = random_corpus(rng, sentences if corpus else 8)  # the first: 8 sentences
            line = f"corpus {corpus:2d}: {len(hyps):3d} sentences "
            for tok in ("none", "13a"):
                for smooth in ("none", "exp", "floor", "add-k"):
                    ours = binary_bleu(binary, hyps, refs, directory, ("--tokenize", tok, "--smooth", smooth))
                    theirs = sacrebleu.corpus_bleu(hyps, [refs], tokenize=tok, smooth_method=smooth,
                                                   force=True).score
                    worst = max(worst, abs(ours - theirs))
                    assert abs(ours - theirs) <= 0.005 + 1e-9, (corpus, tok, smooth, ours, theirs)
                    line += f" {tok}/{smooth} {ours:.2f}"
            print(line)
    print(f"sacreBLEU {sacrebleu.__version__}: {corpora} corpora, 8 combinations each, agree to 2 decimals "
          f"(largest difference {worst:.5f}, the rounding of the printed score)")
    # sacreBLEU's defaults are bleu's: the same score without flags
    hyps, refs = ["we see the house. it is red.", "a b c x y"], ["we see the house . it is red .", "a b c d e"]
    with tempfile.TemporaryDirectory() as directory:
        ours = binary_bleu(binary, hyps, refs, directory)
    theirs = sacrebleu.corpus_bleu(hyps, [refs]).score
    print(f"defaults (13a, exp): '{hyps[0]}' against '{refs[0]}' and a pair with no 4-gram match: "
          f"{ours:.2f} here, {theirs:.2f} in sacreBLEU")
    assert abs(ours - theirs) <= 0.005 + 1e-9, (ours, theirs)

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--sacrebleu":
        check_sacrebleu(sys.argv[2])
    else:
        main()
