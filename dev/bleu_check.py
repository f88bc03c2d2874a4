#!/usr/bin/python3
"""Corpus BLEU of the test cases in test_transformer.c, computed independently.

    /usr/bin/python3 dev/bleu_check.py

Two computations that share no code with transformer.c: a short one of our own
below (collections.Counter, the textbook definition), and NLTK's corpus_bleu
(Debian's python3-nltk; skipped if it is not installed). Both print BLEU on
the 0..100 scale, with the four n-gram precisions and the brevity penalty.
The C tests hold the numbers this prints (NOTES.md, section 7).
"""
import math
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


if __name__ == "__main__":
    main()
