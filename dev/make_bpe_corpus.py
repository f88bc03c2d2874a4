#!/usr/bin/python3
"""Write a synthetic corpus shaped like translation data, for timing §5.1 byte-pair encoding.

    python3 dev/make_bpe_corpus.py --pairs 200000 --types 150000 --out /tmp/zipf200k.tsv
    python3 dev/make_bpe_corpus.py --pairs 4500000 --types 1500000 --out /tmp/zipf4m5.tsv
    python3 dev/make_bpe_corpus.py --pairs 50 --types 40 --out /tmp/tiny.tsv   # the smallest case

Plain Python 3, no third-party packages. Issue 49's corpora: 200,000 pairs of 5-40 words a
side, word frequencies Zipfian (the word of rank r drawn with weight 1/r) over --types word
types, half of them for each side; the paper's WMT 2014 English-German has about 4.5 million
pairs and well over a million word types over both sides. The same arguments give
byte-identical files on any Python 3: every draw comes from our own generator (splitmix64),
not from the `random` module, whose algorithms may change between versions.

The words are not random letters: each is one to six syllables (an onset, a vowel, a coda
that may be empty), the frequent words short and the rare ones long, as in real text, so
that byte-pair encoding finds pairs worth merging. The source side writes with a-z, the
target side also with ä ö ü ß (two-byte UTF-8 characters, one symbol each). Each side's
types are distinct; the script prints how many types and tokens the file holds.
"""
import argparse
import bisect
import math
import sys

MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n

    def uniform(self):
        return (self.next() >> 11) * (1.0 / 9007199254740992.0)


SIDES = {
    "source": {
        "onsets": ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
                   "th", "st", "pr", "tr", "ch", "sh", "gr", "bl", "pl", "str"],
        "vowels": ["a", "e", "i", "o", "u", "ea", "ou", "y", "ai"],
        "codas": ["", "", "", "n", "r", "s", "t", "l", "nd", "ng", "st", "rt", "m", "ck"],
    },
    "target": {
        "onsets": ["", "b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "w", "z",
                   "sch", "st", "pf", "tr", "ch", "gr", "spr", "kl", "fr", "br"],
        "vowels": ["a", "e", "i", "o", "u", "ä", "ö", "ü", "ei", "au", "ie", "eu"],
        "codas": ["", "", "", "n", "r", "s", "t", "l", "nd", "ng", "ß", "ch", "cht", "rn", "en", "er"],
    },
}


def make_types(rng, side, count):
    """count distinct words, the most frequent (first) shortest."""
    letters = SIDES[side]
    words, seen = [], set()
    while len(words) < count:
        rank = len(words) + 1
        # about 1 syllable for the top words, up to 6 for the rarest
        syllables = 1 + min(5, int(math.log10(rank + 1) * 0.9 + rng.uniform() * 2.2))
        word = "".join(letters["onsets"][rng.below(len(letters["onsets"]))] +
                       letters["vowels"][rng.below(len(letters["vowels"]))] +
                       letters["codas"][rng.below(len(letters["codas"]))] for _ in range(syllables))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=200000)
    parser.add_argument("--types", type=int, default=150000, help="word types over both sides")
    parser.add_argument("--min-words", type=int, default=5)
    parser.add_argument("--max-words", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rng = SplitMix64(args.seed)
    half = max(1, args.types // 2)
    vocabularies = [make_types(rng, side, half) for side in ("source", "target")]
    cumulative, total = [], 0.0
    for rank in range(1, half + 1):
        total += 1.0 / rank
        cumulative.append(total)
    seen = [set(), set()]
    tokens = 0
    span = args.max_words - args.min_words + 1
    with open(args.out, "w", encoding="utf-8", newline="\n") as out:
        for _ in range(args.pairs):
            sides = []
            for k in range(2):
                n = args.min_words + rng.below(span)
                ranks = [bisect.bisect_right(cumulative, rng.uniform() * total) for _ in range(n)]
                ranks = [r if r < half else half - 1 for r in ranks]
                seen[k].update(ranks)
                tokens += n
                sides.append(" ".join(vocabularies[k][r] for r in ranks))
            out.write(sides[0] + "\t" + sides[1] + "\n")
    print(f"{args.out}: {args.pairs} pairs, {tokens} words, {len(seen[0])} source and {len(seen[1])} target "
          f"word types used of {half} each", file=sys.stderr)


if __name__ == "__main__":
    main()
