#!/usr/bin/python3
"""Write the toy translation task: English number words -> German number words.

    python3 dev/make_numbers.py                 # writes tiny_data/numbers_{train,dev,test}.tsv
    python3 dev/make_numbers.py --seed 1 --out-dir /tmp/x

Plain Python 3, no third-party packages. The same --seed gives byte-identical
files on any Python 3 version: the shuffles use our own generator (splitmix64),
not the `random` module, whose algorithms may change between versions.

Each line is `english<TAB>german` in UTF-8, e.g.

    three hundred forty two<TAB>dreihundertzweiundvierzig

German writes a number below a million as ONE word, and the ones before the
tens ("zweiundvierzig", two-and-forty), so the word order changes inside the
word. Whole words cannot translate this (every number is a word of its own,
never seen in training); the lab's byte-pair encoding (`train --bpe N`,
lab/NOTES.md, "§5.1 subwords"; the task: dev/RESULTS.md) learns subwords such as `hundert`, `und`, `zig`. The rules,
German standard spelling (Duden) of cardinal numbers:

  * One word, no spaces: 342 dreihundertzweiundvierzig, 7001 siebentausendeins,
    21000 einundzwanzigtausend, 99999 neunundneunzigtausendneunhundertneunundneunzig.
  * Real letters: fünf, zwölf, dreißig, fünfzehn, fünfzig.
  * One is `eins` at the end of the number (eins, einhunderteins,
    zweitausendeins) and `ein` before und / hundert / tausend (einundzwanzig,
    einhundert, eintausend, einunddreißigtausend).
  * 100 and 1000 are written with their count, `einhundert`, `eintausend`
    (German also allows bare "hundert", "tausend"; the count is chosen so that
    one form stands for each, just as English writes `one hundred`).
  * 16 sechzehn and 60 sechzig (not sechs-), 17 siebzehn and 70 siebzig (not
    sieben-), but 7000 siebentausend and 700 siebenhundert; 11 elf, 12 zwölf; 0 null.
  * English follows American usage without "and", one word per number word:
    `one hundred one`, `twenty one thousand`, `forty two`.

Numbers come from 0..99999, split into train, dev and test so that no
number is in two splits; 0 is always in train (no other number has the words
zero / null), and the script checks that every character of dev and test occurs
in train (so that byte-pair encoding can write every test word). The split is
stratified by size so that every split has short and long numbers (a uniform
draw from 0..99999 would be 90% five-digit numbers): the quotas are in SPLITS below.
"""
import argparse
import os
import sys

ENGLISH_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                "seventeen", "eighteen", "nineteen"]
ENGLISH_TENS = [None, None, "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty",
                "ninety"]
GERMAN_ONES = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun",
               "zehn", "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn",
               "siebzehn", "achtzehn", "neunzehn"]
GERMAN_TENS = [None, None, "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig",
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
    """The parts of the German word for 1 <= n <= 999. `final`: nothing follows (so 1 is `eins`)."""
    parts = []
    if n >= 100:
        hundreds = n // 100
        parts += ["ein" if hundreds == 1 else GERMAN_ONES[hundreds], "hundert"]
        n %= 100
    if n >= 20:
        ones, tens = n % 10, n // 10
        if ones > 0:  # the ones come first: zwei und vierzig
            parts += ["ein" if ones == 1 else GERMAN_ONES[ones], "und"]
        parts.append(GERMAN_TENS[tens])
    elif n > 0:
        parts.append("ein" if n == 1 and not final else GERMAN_ONES[n])
    return parts


def german_parts(n):
    """The German word for n as its parts: 342 -> drei hundert zwei und vierzig."""
    if n == 0:
        return ["null"]
    parts = []
    if n >= 1000:
        parts += german_below_1000(n // 1000, final=False) + ["tausend"]
        n %= 1000
    if n > 0:
        parts += german_below_1000(n, final=True)
    return parts


def german(n):
    """German writes the number as one word: the parts joined."""
    return ["".join(german_parts(n))]


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
        12: ("twelve", "zwölf"),
        16: ("sixteen", "sechzehn"),
        17: ("seventeen", "siebzehn"),
        20: ("twenty", "zwanzig"),
        21: ("twenty one", "einundzwanzig"),
        30: ("thirty", "dreißig"),
        67: ("sixty seven", "siebenundsechzig"),
        100: ("one hundred", "einhundert"),
        101: ("one hundred one", "einhunderteins"),
        111: ("one hundred eleven", "einhundertelf"),
        342: ("three hundred forty two", "dreihundertzweiundvierzig"),
        700: ("seven hundred", "siebenhundert"),
        1000: ("one thousand", "eintausend"),
        1001: ("one thousand one", "eintausendeins"),
        2021: ("two thousand twenty one", "zweitausendeinundzwanzig"),
        7001: ("seven thousand one", "siebentausendeins"),
        16017: ("sixteen thousand seventeen", "sechzehntausendsiebzehn"),
        21000: ("twenty one thousand", "einundzwanzigtausend"),
        31555: ("thirty one thousand five hundred fifty five", "einunddreißigtausendfünfhundertfünfundfünfzig"),
        99999: ("ninety nine thousand nine hundred ninety nine",
                "neunundneunzigtausendneunhundertneunundneunzig"),
    }
    for n, (en, de) in cases.items():
        got = (" ".join(english(n)), " ".join(german(n)))
        if got != (en, de):
            sys.exit(f"make_numbers.py: rule check failed for {n}: got {got}, expected {(en, de)}")


def german_split(word, parts):
    """Cuts a German number word into its parts, longest known part first
    (achtzehn before acht), independently of the rules that joined them."""
    out = []
    while word:
        part = max((p for p in parts if word.startswith(p)), key=len, default=None)
        if part is None:
            raise ValueError(word)
        out.append(part)
        word = word[len(part):]
    return out


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
    """Every number 0..LARGEST: both sides read back to the number (the German
    word cut into its parts anew); one is `eins` only at the end and `ein`
    never there; `und` stands between a one and a ten."""
    en_ones = {w: i for i, w in enumerate(ENGLISH_ONES)}
    en_tens = {w: 10 * i for i, w in enumerate(ENGLISH_TENS) if w}
    de_ones = {w: i for i, w in enumerate(GERMAN_ONES)}
    de_ones["ein"] = 1
    de_tens = {w: 10 * i for i, w in enumerate(GERMAN_TENS) if w}
    known_parts = set(de_ones) | set(de_tens) | {"und", "hundert", "tausend"}
    for n in range(LARGEST + 1):
        en, (word,) = english(n), german(n)
        de = german_split(word, known_parts)
        ok = de == german_parts(n) and " " not in word
        ok = ok and value_of(en, en_ones, en_tens, "hundred", "thousand") == n
        ok = ok and value_of(de, de_ones, de_tens, "hundert", "tausend") == n
        ok = ok and "eins" not in de[:-1] and de[-1] != "ein"
        ok = ok and all(0 < i < len(de) - 1 and de[i - 1] in de_ones and de[i + 1] in de_tens
                        for i, w in enumerate(de) if w == "und")
        if not ok:
            sys.exit(f"make_numbers.py: check failed for {n}: {en} -> {word} ({de})")


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
    train_characters = {c for n in splits["train"] for w in english(n) + german(n) for c in w}
    for name in ("dev", "test"):
        unseen = {c for n in splits[name] for w in english(n) + german(n) for c in w} - train_characters
        if unseen:  # byte-pair encoding could not write these words without <unk>
            sys.exit(f"make_numbers.py: seed {args.seed}: {name} has characters not in train: {sorted(unseen)}")
    os.makedirs(args.out_dir, exist_ok=True)
    seen = set()
    for name, numbers in splits.items():
        assert not seen.intersection(numbers), "a number is in two splits"
        seen.update(numbers)
        rng.shuffle(numbers)  # file order mixes short and long numbers
        path = os.path.join(args.out_dir, f"numbers_{name}.tsv")
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for n in numbers:
                f.write(" ".join(english(n)) + "\t" + " ".join(german(n)) + "\n")
        print(f"{path}: {len(numbers)} pairs")


if __name__ == "__main__":
    main()
