"""The forward level on a sample nobody could choose: `--sample N` re-scores N items of each stratum (an experiment
of run.py evidence, a task of an lm-eval run) drawn from a seed the evidence's author cannot know, and says what
such a sample can and cannot find.

The seed: fresh randomness at audit time (secrets.token_hex) unless the reader passes `--sample-seed S` — to repeat
a printed draw, or as a challenge of their own. A seed derived from the evidence would not do: a forger edits a
harmless field and re-draws until the altered items fall outside the sample. A published ranking is worse: the
forger alters the items at its end. The draw: the stratum's item keys ranked by sha256("evidence-sample-v2:<seed>:
<stratum>:<key>") and the first N taken, so anyone holding the seed gets the same items, and nobody without it can
tell which they will be. Every stratum is drawn (every task, every experiment); an lm-eval document carries every
filter's line, so every filter is in every drawn document.

The detection bound is exact for a finite population: drawing n of M items without replacement, if k of them were
altered the sample misses all k with probability C(M - k, n) / C(M, n) (hypergeometric). detection_k gives the
smallest k for which the sample finds one with probability >= p. It bounds a forger who alters items the forward
level would catch one by one; what was not drawn was not looked at, and the report says so."""
import hashlib
import secrets
from fractions import Fraction
from math import comb

SALT = "evidence-sample-v2"
CONFIDENCE = Fraction(99, 100)          # the probability the bound is stated for


def fresh_seed():
    """A seed nobody knew before this audit (128 bits)."""
    return secrets.token_hex(16)


def draw(seed, stratum, keys, n):
    """The n keys of `keys` (all when n >= their number) ranked first by sha256(SALT:seed:stratum:key), in the
    keys' own order."""
    keys = list(keys)
    if n is None or n >= len(keys):
        return keys
    rank = {k: hashlib.sha256(f"{SALT}:{seed}:{stratum}:{k}".encode()).hexdigest() for k in keys}
    chosen = set(sorted(keys, key=lambda k: rank[k])[:n])
    return [k for k in keys if k in chosen]


def miss_probability(population, drawn, altered):
    """The exact probability that `drawn` items taken without replacement from `population` miss all of
    `altered` ones."""
    if altered <= 0:
        return Fraction(1)
    return Fraction(comb(population - altered, drawn), comb(population, drawn))


def detection_k(population, drawn, p=CONFIDENCE):
    """The smallest k such that a sample of `drawn` of `population` finds one of k altered items with probability
    >= p (binary search: the miss probability falls as k grows); None for an empty sample."""
    if drawn <= 0 or population <= 0:
        return None
    lo, hi = 1, population
    while lo < hi:
        mid = (lo + hi) // 2
        if 1 - miss_probability(population, drawn, mid) >= p:
            hi = mid
        else:
            lo = mid + 1
    return lo


class Sample:
    """One audit's --sample setting: n per stratum (None: every item), the seed and where it came from."""

    def __init__(self, n=None, seed=None):
        self.n = n
        self.source = "given with --sample-seed" if seed is not None else "fresh at audit time"
        self.seed = seed if seed is not None else (fresh_seed() if n is not None else None)

    def keys(self, stratum, keys):
        return draw(self.seed, stratum, keys, self.n)

    def describe(self, drawn, population, unit="items"):
        """The row's words: sampled n of M, the seed and its source, the bound — or "every <unit>"."""
        if self.n is None or drawn >= population:
            return f"all {population} {unit}"
        k = detection_k(population, drawn)
        return (f"a sample: {drawn} of {population} {unit} (seed {self.seed}, {self.source}; re-run with "
                f"--sample-seed {self.seed}); if at least {k} of the {population} were altered, this sample finds one "
                f"with probability >= {float(CONFIDENCE):g}; the other {population - drawn} were not re-scored")

    def figures(self, drawn, population):
        """For audit.json."""
        if self.n is None:
            return None
        return {"n": self.n, "drawn": drawn, "population": population, "seed": self.seed, "seed_source": self.source,
                "salt": SALT, "k_for_p99": detection_k(population, drawn) if drawn < population else 1}


MAX_SEED_CHARS = 200


def from_args(n, seed, forward):
    """The Sample of `--sample N` / `--sample-seed S` (forward: whether --forward was given), or the one-line
    error that refuses them."""
    if n is None and seed is None:
        return Sample()
    if n is None:
        return "--sample-seed S repeats a --sample draw: pass --sample N too"
    if n < 1:
        return f"--sample {n}: expected a positive number of items per experiment or task"
    if not forward:
        return "--sample N draws the items of the forward level: pass --forward too"
    if seed is not None and not (0 < len(seed) <= MAX_SEED_CHARS and seed.isprintable() and seed.strip() == seed):
        return (f"--sample-seed: expected 1 to {MAX_SEED_CHARS} printable characters without surrounding spaces, "
                f"found {seed[:40]!r}{'...' if len(seed) > 40 else ''}")
    return Sample(n, seed)


def report_entry(sample, levels_run_forward):
    """audit.json's "sample" (None when the forward level read every item): n, seed, source, salt."""
    if sample.n is None or not levels_run_forward:
        return None
    return {"n": sample.n, "seed": sample.seed, "seed_source": sample.source, "salt": SALT}


def report_line(entry):
    """The line printed above RESULT for a sampled forward level (the seed exactly as given: it is the draw)."""
    return (f"SAMPLE: the forward level re-scored {entry['n']} item(s) of each experiment/task, drawn from seed "
            f"{entry['seed']} ({entry['seed_source']}); `--sample {entry['n']} --sample-seed {entry['seed']}` repeats "
            "the draw; each forward row gives its detection bound; the other levels read every item")


def sample_records(sample, stratum, records, key_of, group_of=None):
    """(the records the forward level re-scores, the row's words, audit.json's figures): `sample`'s draw of each
    group (group_of(record): e.g. a harness task; one group without it) as its own stratum "<stratum>/<group>",
    in the records' order."""
    if sample.n is None:
        return records, sample.describe(len(records), len(records)), None
    groups = {}
    for r in records:
        groups.setdefault(group_of(r) if group_of else None, []).append(r)
    keep, words, figures = set(), [], {}
    for g, members in groups.items():
        name = stratum if g is None else f"{stratum}/{g}"
        drawn = sample.keys(name, [str(key_of(r)) for r in members])
        keep |= set(drawn)
        words.append(("" if g is None else f"{g}: ") + sample.describe(len(drawn), len(members)))
        figures[name] = sample.figures(len(drawn), len(members))
    return [r for r in records if str(key_of(r)) in keep], "; ".join(words), figures
