#!/usr/bin/python3
"""Write the toy translation task: English number words -> German number words.

    python3 dev/make_numbers.py                 # writes tiny_data/numbers_{train,dev,test}.tsv
    python3 dev/make_numbers.py --seed 1 --out-dir /tmp/x

Plain Python 3, no third-party packages. The same --seed gives byte-identical
files on any Python 3 version: the shuffles use our own generator (splitmix64),
not the `random` module, whose algorithms may change between versions.

Each line is `english<TAB>german`, tokens separated by single spaces, e.g.

    three hundred forty two<TAB>drei hundert zwei und vierzig

German writes the ones before the tens ("zweiundvierzig", two-and-forty), so
the word order changes between the languages. The rules (in short: NOTES.md, section 6):

  * German compounds are split into their parts, one token each:
    zweihundert -> `zwei hundert`, zweiundvierzig -> `zwei und vierzig`,
    dreitausend -> `drei tausend`. The teens and the tens stay one token
    (dreizehn, vierzig), as English keeps thirteen and forty.
  * Tokens are ASCII: ue for u-umlaut, oe for o-umlaut, ss for sharp s
    (fuenf, fuenfzehn, fuenfzig, zwoelf, dreissig).
  * One is `eins` when it stands at the end of the number (eins, ein hundert
    eins, zwei tausend eins) and `ein` before und / hundert / tausend
    (ein und zwanzig, ein hundert, ein tausend, ein und dreissig tausend).
  * Hundreds and thousands always carry their count: 100 -> `ein hundert`
    (German also allows a bare "hundert"; we always write the count), just as
    English writes `one hundred`.
  * 16 is sechzehn and 60 sechzig (not sechs-), 17 siebzehn and 70 siebzig
    (not sieben-); 11 elf, 12 zwoelf; 0 null.
  * English follows American usage without "and": `one hundred one`,
    `twenty one thousand`; tens and ones are two tokens (`forty two`).

Numbers come from 0..99999, split into train, dev and test so that no
number is in two splits; 0 is always in train (no other number has the words
zero / null), and the script checks that every word of dev and test occurs in train. The split is stratified by size so that every split
has short and long numbers (a uniform draw from 0..99999 would be 90% five-digit
numbers): the quotas are in SPLITS below.
"""
import argparse
import os
import sys

ENGLISH_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                "seventeen", "eighteen", "nineteen"]
ENGLISH_TENS = [None, None, "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty",
                "ninety"]
GERMAN_ONES = ["null", "eins", "zwei", "drei", "vier", "fuenf", "sechs", "sieben", "acht", "neun",
               "zehn", "elf", "zwoelf", "dreizehn", "vierzehn", "fuenfzehn", "sechzehn",
               "siebzehn", "achtzehn", "neunzehn"]
GERMAN_TENS = [None, None, "zwanzig", "dreissig", "vierzig", "fuenfzig", "sechzig", "siebzig",
               "achtzig", "neunzig"]

LARGEST = 99999

# (lowest, highest, train, dev, test): how many numbers each split takes from
# the range lowest..highest. Every number 0..99 is used; a number is in one split only.
SPLITS = [
    (0, 99, 80, 10, 10),
    (100, 999, 600, 100, 200),
    (1000, 9999, 1600, 150, 300),
    (10000, 99999, 2720, 240, 490),
]


def english_below_1000(n):
    """English words for 1 <= n <= 999, as a list of tokens."""
    words = []
    if n >= 100:
        words += [ENGLISH_ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        words.append(ENGLISH_TENS[n // 10])
        n %= 10
    if n > 0:
        words.append(ENGLISH_ONES[n])
    return words


def english(n):
    if n == 0:
        return ["zero"]
    words = []
    if n >= 1000:
        words += english_below_1000(n // 1000) + ["thousand"]
        n %= 1000
    if n > 0:
        words += english_below_1000(n)
    return words


def german_below_1000(n, final):
    """German words for 1 <= n <= 999. `final`: nothing follows (so 1 is `eins`)."""
    words = []
    if n >= 100:
        hundreds = n // 100
        words += ["ein" if hundreds == 1 else GERMAN_ONES[hundreds], "hundert"]
        n %= 100
    if n >= 20:
        ones, tens = n % 10, n // 10
        if ones > 0:  # the ones come first: zwei und vierzig
            words += ["ein" if ones == 1 else GERMAN_ONES[ones], "und"]
        words.append(GERMAN_TENS[tens])
    elif n > 0:
        words.append("ein" if n == 1 and not final else GERMAN_ONES[n])
    return words


def german(n):
    if n == 0:
        return ["null"]
    words = []
    if n >= 1000:
        words += german_below_1000(n // 1000, final=False) + ["tausend"]
        n %= 1000
    if n > 0:
        words += german_below_1000(n, final=True)
    return words


class SplitMix64:
    """Steele, Lea & Flood (2014): a tiny generator whose output is fixed by its definition."""
    MASK = (1 << 64) - 1

    def __init__(self, seed):
        self.state = seed & self.MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return z ^ (z >> 31)

    def below(self, n):
        """Uniform integer in [0, n), by rejection (no modulo bias)."""
        limit = (1 << 64) - (1 << 64) % n
        while True:
            x = self.next()
            if x < limit:
                return x % n

    def shuffle(self, items):
        """Fisher-Yates, in place."""
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]


def self_check():
    """Spot checks of the rules, against numbers worked out by hand."""
    cases = {
        0: ("zero", "null"),
        1: ("one", "eins"),
        7: ("seven", "sieben"),
        11: ("eleven", "elf"),
        12: ("twelve", "zwoelf"),
        16: ("sixteen", "sechzehn"),
        17: ("seventeen", "siebzehn"),
        20: ("twenty", "zwanzig"),
        21: ("twenty one", "ein und zwanzig"),
        30: ("thirty", "dreissig"),
        67: ("sixty seven", "sieben und sechzig"),
        100: ("one hundred", "ein hundert"),
        101: ("one hundred one", "ein hundert eins"),
        111: ("one hundred eleven", "ein hundert elf"),
        342: ("three hundred forty two", "drei hundert zwei und vierzig"),
        1000: ("one thousand", "ein tausend"),
        1001: ("one thousand one", "ein tausend eins"),
        2021: ("two thousand twenty one", "zwei tausend ein und zwanzig"),
        16017: ("sixteen thousand seventeen", "sechzehn tausend siebzehn"),
        21000: ("twenty one thousand", "ein und zwanzig tausend"),
        99999: ("ninety nine thousand nine hundred ninety nine",
                "neun und neunzig tausend neun hundert neun und neunzig"),
    }
    for n, (en, de) in cases.items():
        got = (" ".join(english(n)), " ".join(german(n)))
        if got != (en, de):
            sys.exit(f"make_numbers.py: rule check failed for {n}: got {got}, expected {(en, de)}")


def value_of(tokens, ones, tens, hundred, thousand):
    """The number that words written by the rules above stand for, read left to
    right by adding and multiplying (not by the rules that wrote them)."""
    total, current = 0, 0
    for token in tokens:
        if token in ones:
            current += ones[token]
        elif token in tens:
            current += tens[token]
        elif token == hundred:
            current *= 100
        elif token == thousand:
            total, current = total + current * 1000, 0
        elif token != "und":
            raise ValueError(token)
    return total + current


def check_all():
    """Every number 0..LARGEST: both sides read back to the number; one is
    `eins` only at the end and `ein` never; `und` stands between a one and a ten."""
    en_ones = {w: i for i, w in enumerate(ENGLISH_ONES)}
    en_tens = {w: 10 * i for i, w in enumerate(ENGLISH_TENS) if w}
    de_ones = {w: i for i, w in enumerate(GERMAN_ONES)}
    de_ones["ein"] = 1
    de_tens = {w: 10 * i for i, w in enumerate(GERMAN_TENS) if w}
    for n in range(LARGEST + 1):
        en, de = english(n), german(n)
        ok = value_of(en, en_ones, en_tens, "hundred", "thousand") == n
        ok = ok and value_of(de, de_ones, de_tens, "hundert", "tausend") == n
        ok = ok and "eins" not in de[:-1] and de[-1] != "ein"
        ok = ok and all(0 < i < len(de) - 1 and de[i - 1] in de_ones and de[i + 1] in de_tens
                        for i, w in enumerate(de) if w == "und")
        if not ok:
            sys.exit(f"make_numbers.py: check failed for {n}: {en} -> {de}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=2017, help="shuffle seed (default 2017)")
    parser.add_argument("--out-dir", default=os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "tiny_data")))
    args = parser.parse_args()
    self_check()
    check_all()
    rng = SplitMix64(args.seed)
    splits = {"train": [], "dev": [], "test": []}
    for lowest, highest, n_train, n_dev, n_test in SPLITS:
        pool = list(range(lowest, highest + 1))
        if lowest == 0:  # 0 goes to train: no other number has the words zero / null
            pool.remove(0)
            splits["train"].append(0)
            n_train -= 1
        rng.shuffle(pool)
        assert n_train + n_dev + n_test <= len(pool)
        splits["train"] += pool[:n_train]
        splits["dev"] += pool[n_train:n_train + n_dev]
        splits["test"] += pool[n_train + n_dev:n_train + n_dev + n_test]
    train_words = {w for n in splits["train"] for w in english(n) + german(n)}
    for name in ("dev", "test"):
        unseen = {w for n in splits[name] for w in english(n) + german(n)} - train_words
        if unseen:  # a model could never write a word it was not trained on
            sys.exit(f"make_numbers.py: seed {args.seed}: {name} has words not in train: {sorted(unseen)}")
    seen = set()
    for name, numbers in splits.items():
        assert not seen.intersection(numbers), "a number is in two splits"
        seen.update(numbers)
        rng.shuffle(numbers)  # file order mixes short and long numbers
        path = os.path.join(args.out_dir, f"numbers_{name}.tsv")
        with open(path, "w", encoding="ascii", newline="\n") as f:
            for n in numbers:
                f.write(" ".join(english(n)) + "\t" + " ".join(german(n)) + "\n")
        print(f"{path}: {len(numbers)} pairs")


if __name__ == "__main__":
    main()
