"""evidence_audit/sampling.py: the forward level's sample, drawn from a seed the evidence's author cannot know, and
its detection bound (exact, hypergeometric) checked against a simulation of forgers."""
import hashlib
import math
import random
from fractions import Fraction

import pytest

from evidence_audit import sampling


def test_the_draw_depends_on_the_seed_and_is_repeatable_from_it():
    keys = [str(i) for i in range(100)]
    a = sampling.draw("seed-a", "task", keys, 10)
    assert a == sampling.draw("seed-a", "task", keys, 10) and len(a) == 10
    assert a == sorted(a, key=int)                                    # the keys' own order
    assert a != sampling.draw("seed-b", "task", keys, 10)
    assert a != sampling.draw("seed-a", "other task", keys, 10)       # each stratum its own draw
    assert sampling.draw("seed-a", "task", keys, 1000) == keys


@pytest.mark.parametrize("M, n", [(9, 4), (200, 20), (872, 50), (14042, 200)])
def test_detection_k_is_the_smallest_k_that_reaches_the_confidence(M, n):
    k = sampling.detection_k(M, n)
    assert 1 - sampling.miss_probability(M, n, k) >= sampling.CONFIDENCE
    assert k == 1 or 1 - sampling.miss_probability(M, n, k - 1) < sampling.CONFIDENCE


def test_the_miss_probability_is_the_hypergeometric_one():
    # C(M-k, n) / C(M, n) as a product: the chance each of the n draws avoids the k altered items
    M, n, k = 50, 7, 5
    product = Fraction(1)
    for i in range(n):
        product *= Fraction(M - k - i, M - i)
    assert sampling.miss_probability(M, n, k) == product


@pytest.mark.parametrize("M, n, k", [(200, 20, 10), (60, 6, 1), (100, 30, 4)])
def test_the_bound_matches_a_simulation_of_forgers(M, n, k):
    """A forger alters k of M items at random; the audit draws n from a fresh seed. Over 3000 forgeries the share the
    sample catches must agree with 1 - C(M-k, n)/C(M, n) within 4.5 standard errors."""
    rng = random.Random(f"{M}-{n}-{k}")
    trials, caught = 3000, 0
    keys = [str(i) for i in range(M)]
    for _ in range(trials):
        altered = set(rng.sample(keys, k))
        drawn = sampling.draw(sampling.fresh_seed(), "task", keys, n)
        caught += bool(altered & set(drawn))
    p = float(1 - sampling.miss_probability(M, n, k))
    se = math.sqrt(p * (1 - p) / trials)
    assert abs(caught / trials - p) <= 4.5 * se + 1e-9, (caught / trials, p)


def test_a_forger_who_alters_the_end_of_a_published_ranking_is_caught_as_often_as_the_bound_says():
    """The earlier rule ranked documents by a published hash: altering everything outside its first N passed every
    time. Against a fresh seed, the same forgery is caught with the bound's probability."""
    M, n = 200, 20
    keys = [str(i) for i in range(M)]
    published = sorted(keys, key=lambda d: hashlib.sha256(f"published:t:{d}".encode()).hexdigest())
    altered = set(published[n:n + 2])                    # 2 of the items the published ranking never reaches
    trials = 3000
    caught = sum(bool(altered & set(sampling.draw(sampling.fresh_seed(), "t", keys, n))) for _ in range(trials))
    p = float(1 - sampling.miss_probability(M, n, 2))
    assert abs(caught / trials - p) <= 4.5 * math.sqrt(p * (1 - p) / trials), (caught / trials, p)


def test_stratified_records_keep_every_group_and_their_order():
    records = [{"idx": f"{task}/{i}"} for task in ("a", "b", "c") for i in range(10)]
    s = sampling.Sample(2, "x")
    kept, words, figures = sampling.sample_records(s, "harness", records, lambda r: r["idx"],
                                                   lambda r: r["idx"].split("/")[0])
    assert [r["idx"].split("/")[0] for r in kept] == ["a", "a", "b", "b", "c", "c"]
    assert kept == [r for r in records if r in kept]
    assert set(figures) == {"harness/a", "harness/b", "harness/c"} and "seed x" in words
    assert sampling.sample_records(sampling.Sample(), "h", records, lambda r: r["idx"])[0] == records


@pytest.mark.parametrize("n, seed, forward, says", [
    (None, "s", True, "pass --sample N too"), (0, None, True, "--sample 0: expected a positive"),
    (5, None, False, "pass --forward too"), (5, "a\nb", True, "printable"), (5, "x" * 500, True, "printable"),
])
def test_bad_sample_arguments_get_one_line(n, seed, forward, says):
    got = sampling.from_args(n, seed, forward)
    assert isinstance(got, str) and says in got


def test_the_row_says_what_was_not_looked_at():
    s = sampling.Sample(20, "abc")
    words = s.describe(20, 872, "documents")
    k = sampling.detection_k(872, 20)
    assert words.startswith("a sample: 20 of 872 documents (seed abc, given with --sample-seed; re-run with "
                            "--sample-seed abc)")
    assert f"if at least {k} of the 872 were altered" in words and "the other 852 were not re-scored" in words
    assert sampling.Sample().describe(9, 9, "documents") == "all 9 documents"
