"""Test strings for the token-id exactness test (tests/tokenize/test_token_ids.py), drawn from a
seeded generator: fuzzed Unicode restricted to code points assigned in Unicode 14 (Python's
unicodedata must be at 14.0.0, as Debian 12's python3 is: Oniguruma 6.9.8, which HF's tokenizers
and slidedp use, knows Unicode 14, while the JS engine and utf8proc know later versions), real
multilingual text (CLDR names of languages, territories, months and days in every locale of
Debian's python3-babel), code (lines of Debian's Python standard library), digits, contractions,
whitespace runs and text around the tokenizer's added tokens (special or not).

HF's Rust tokenizers normalizes with tables older than Unicode 14 (it treats combining marks
added since, e.g. U+10F4D from Unicode 11, as starters and does not reorder them), so fuzzed
strings that hold a character NFC can reorder or compose and that was assigned after Unicode 3.2
(absent from Python's unicodedata.ucd_3_2_0) are redrawn; the count is printed."""
import glob
import random
import sys
import unicodedata

UNICODE_VERSION = "14.0.0"
WHITESPACE = " \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
             "\u2028\u2029\u202f\u205f\u3000"
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "’s", "'x"]
WORDS = ["I", "you", "don", "we", "they", "it", "He", "SHE", "can", "won", "Let", "that", "y'all", "o", "ß", "İ"]


def assigned_code_points():
    if unicodedata.unidata_version != UNICODE_VERSION:
        sys.exit(f"unicodedata is Unicode {unicodedata.unidata_version}; this test fuzzes Unicode {UNICODE_VERSION}")
    # U+0000 is left out: it cannot appear in a C string from the JSON reader.
    return [c for c in range(1, 0x110000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]


def late_normalizing_chars(cps):
    """Code points NFC can reorder or compose (a combining class, or part of a canonical
    decomposition) that Unicode 3.2 did not have."""
    involved = set()
    for c in cps:
        d = unicodedata.decomposition(chr(c))
        if d and not d.startswith("<"):
            involved.add(c)
            involved.update(int(x, 16) for x in d.split())
        if unicodedata.combining(chr(c)):
            involved.add(c)
    return {c for c in involved if unicodedata.ucd_3_2_0.category(chr(c)) == "Cn"}


def fuzz(rng, pools, n, late):
    out = []
    redrawn = 0
    while len(out) < n:
        k = rng.choice([1, 2, 3, 5, 8, 13, 21, 40])
        s = "".join(chr(rng.choice(rng.choice(pools))) for _ in range(k))
        if not any(ord(ch) in late for ch in s):
            out.append(s)
        else:
            redrawn += 1
    print(f"  fuzz: {n} strings; {redrawn} redrawn that held a character NFC treats differently by Unicode version")
    return out


def multilingual(rng, n):
    from babel import Locale, localedata
    texts = []
    for ident in sorted(localedata.locale_identifiers()):
        try:
            loc = Locale.parse(ident)
        except Exception:
            continue
        names = list(loc.territories.values()) + list(loc.languages.values())
        names += list(loc.months["format"]["wide"].values()) + list(loc.days["format"]["wide"].values())
        texts.extend(names)
    texts = sorted(set(texts))
    out = []
    for _ in range(n):
        out.append(rng.choice([" ", ", ", "\n", "", " - "]).join(rng.sample(texts, rng.randint(1, 6))))
    return out


def code(rng, n):
    files = sorted(glob.glob("/usr/lib/python3*/[a-z]*.py"))
    lines = []
    for f in files[:200]:
        with open(f, encoding="utf-8", errors="replace") as fh:
            lines.extend(fh.read().split("\n"))
    out = []
    for _ in range(n):
        i = rng.randrange(len(lines))
        out.append("\n".join(lines[i:i + rng.randint(1, 12)]))
    return out


def digits(rng, n):
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 5)):
            d = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 14)))
            parts.append(d + rng.choice(["", ".", ",", " ", "e-3", "%", "x", "٣٤", "１２"]))
        out.append(rng.choice(["", " ", "$", "v"]).join(parts))
    return out


def contractions(rng, n):
    return ["".join(rng.choice(WORDS) + rng.choice(CONTRACTIONS) + rng.choice(["", " ", "'", "s"])
                    for _ in range(rng.randint(1, 5))) for _ in range(n)]


def whitespace(rng, n):
    out = []
    for _ in range(n):
        s = []
        for _ in range(rng.randint(1, 6)):
            s.append("".join(rng.choice(WHITESPACE) for _ in range(rng.randint(0, 7))))
            s.append(rng.choice(["word", "x", "1", "!", "", "é", "中文"]))
        out.append("".join(s))
    return out


def special(rng, n, added):
    out = []
    fillers = ["hi", " ", "\n", "<|", "|>", "<", "x<|im_", "\n\n", "assistant", "<think>", ""]
    for _ in range(n):
        s = []
        for _ in range(rng.randint(1, 6)):
            t = rng.choice(added)
            if rng.random() < 0.2:
                t = t[:rng.randint(1, len(t))]   # a cut-off token is plain text
            s.append(t)
            s.append(rng.choice(fillers))
        out.append("".join(s))
    return out


def make(seed, added_tokens):
    """About 5,400 strings for one tokenizer, all from rng(seed)."""
    rng = random.Random(seed)
    cps = assigned_code_points()
    ascii_ = list(range(0x20, 0x7f)) + [0x09, 0x0a, 0x0d]
    latin = [c for c in cps if c < 0x250]
    combining = [c for c in cps if unicodedata.category(chr(c)) in ("Mn", "Mc", "Me")]
    letters = [c for c in cps if unicodedata.category(chr(c)).startswith("L")]
    numbers = [c for c in cps if unicodedata.category(chr(c)).startswith("N")]
    astral = [c for c in cps if c >= 0x10000]
    spaces = [ord(c) for c in WHITESPACE]
    pools = [cps, ascii_, latin, combining, letters, numbers, astral, spaces]
    strings = fuzz(rng, pools, 2400, late_normalizing_chars(cps))
    strings += multilingual(rng, 900)
    strings += code(rng, 600)
    strings += digits(rng, 400)
    strings += contractions(rng, 400)
    strings += whitespace(rng, 400)
    strings += special(rng, 400, added_tokens)
    return strings
