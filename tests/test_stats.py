"""Uncertainty figures and --split all, fast.

experiments/stats.py (the runner's) and evidence_audit/uncertainty.py (the audit's, written separately) against
values computed here by hand or by scipy (installed in .venv; each scipy check is skipped without it), their edge
cases (n = 0, no discordant pairs), the audit's tolerance rule, and the selection rule of split all on both sides.
"""
import math
import random
from statistics import NormalDist

import pytest

from evidence_audit import definitions as audit_definitions
from evidence_audit import uncertainty as audit_unc
from evidence_audit.checks import compare_tree
from experiments import selection, stats


def scipy_stats():
    return pytest.importorskip("scipy.stats")


# ---- Wilson ----------------------------------------------------------------------------------------------------

def test_z_is_the_normal_0975_quantile():
    assert stats.Z95 == NormalDist().inv_cdf(0.975)
    assert audit_unc.Z == stats.Z95


def test_wilson_42_of_64_by_hand():
    # centre (42 + z^2/2) / (64 + z^2), half-width z / (64 + z^2) * sqrt(42 * 22 / 64 + z^2 / 4), z = 1.959964
    z2 = 1.959963984540054 ** 2
    centre = (42 + z2 / 2) / (64 + z2)                          # 0.6473...
    half = 1.959963984540054 / (64 + z2) * math.sqrt(42 * 22 / 64 + z2 / 4)
    lo, hi = stats.wilson(42, 64)
    assert (round(lo, 4), round(hi, 4)) == (0.5340, 0.7608)
    assert lo == pytest.approx(centre - half, abs=1e-12) and hi == pytest.approx(centre + half, abs=1e-12)
    assert audit_unc.wilson95(42, 64) == pytest.approx([lo, hi], abs=1e-12)


@pytest.mark.parametrize("k, n", [(42, 64), (0, 10), (10, 10), (1, 1), (13, 64), (27, 64), (444, 872)])
def test_wilson_agrees_with_scipy(k, n):
    ci = scipy_stats().binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert stats.wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert audit_unc.wilson95(k, n) == pytest.approx([ci.low, ci.high], abs=1e-12)


def test_wilson_edges():
    assert stats.wilson(0, 0) is None and audit_unc.wilson95(0, 0) is None
    assert stats.wilson(0, 7)[0] == 0.0 and stats.wilson(7, 7)[1] == 1.0       # exact, not 1e-17
    assert audit_unc.wilson95(0, 7)[0] == 0.0 and audit_unc.wilson95(7, 7)[1] == 1.0
    entry = stats.accuracy_entry(0, 0)
    assert entry["wilson95"] is None and "n = 0" in entry["reason"]
    assert audit_unc.accuracy_figures(0, 0) == entry
    with pytest.raises(ValueError):
        stats.wilson(5, 4)


# ---- McNemar ---------------------------------------------------------------------------------------------------

def test_mcnemar_3_9_by_hand():
    # 2 * P(X <= 3), X ~ Bin(12, 1/2) = 2 * (1 + 12 + 66 + 220) / 4096 = 598 / 4096
    assert stats.mcnemar_exact(3, 9) == 598 / 4096 == 0.14599609375
    assert round(stats.mcnemar_exact(9, 3), 3) == 0.146
    assert audit_definitions.mcnemar_exact(3, 9) == 598 / 4096


def test_mcnemar_edges():
    assert stats.mcnemar_exact(0, 0) == 1.0          # no discordant pairs
    assert stats.mcnemar_exact(5, 5) == 1.0          # 2 * P(X <= 5), X ~ Bin(10, 1/2) > 1: capped
    assert stats.mcnemar_exact(0, 5) == 2 / 32


@pytest.mark.parametrize("b, c", [(3, 9), (0, 1), (14, 0), (20, 31), (100, 130), (7, 7)])
def test_mcnemar_agrees_with_scipy(b, c):
    p = scipy_stats().binomtest(b, b + c, 0.5, alternative="two-sided").pvalue
    assert stats.mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)


# ---- Newcombe's method 10 --------------------------------------------------------------------------------------

def newcombe_by_hand(n11, n10, n01, n00):
    """Method 10 written out from scipy's Wilson limits (a third implementation, for the test only)."""
    st = scipy_stats()
    n = n11 + n10 + n01 + n00
    a, b = n11 + n10, n11 + n01
    ca = st.binomtest(a, n).proportion_ci(method="wilson")
    cb = st.binomtest(b, n).proportion_ci(method="wilson")
    p1, p2 = a / n, b / n
    den = a * (n - a) * b * (n - b)
    phi = (n11 * n00 - n10 * n01) / math.sqrt(den) if den else 0.0
    d = p1 - p2
    lower = d - math.sqrt((p1 - ca.low) ** 2 - 2 * phi * (p1 - ca.low) * (cb.high - p2) + (cb.high - p2) ** 2)
    upper = d + math.sqrt((ca.high - p1) ** 2 - 2 * phi * (ca.high - p1) * (p2 - cb.low) + (p2 - cb.low) ** 2)
    return lower, upper


def test_newcombe_36_12_2_0_by_hand():
    # n = 50, acc_a = 48/50, acc_b = 38/50, difference 0.2; phi = (0 - 24) / sqrt(48 * 2 * 38 * 12) = -0.3244
    lo, hi = stats.newcombe_paired(36, 12, 2, 0)
    assert (round(lo, 4), round(hi, 4)) == (0.0569, 0.3404)
    assert stats.phi(36, 12, 2, 0) == pytest.approx(-24 / math.sqrt(48 * 2 * 38 * 12))
    assert (lo, hi) == pytest.approx(newcombe_by_hand(36, 12, 2, 0), abs=1e-12)


@pytest.mark.parametrize("table", [(8, 5, 4, 27), (1, 1, 7, 12), (5, 5, 0, 0), (0, 0, 0, 10), (13, 0, 14, 37),
                                   (20, 9, 3, 32)])
def test_newcombe_agrees_with_a_third_implementation(table):
    assert stats.newcombe_paired(*table) == pytest.approx(newcombe_by_hand(*table), abs=1e-12)


def test_newcombe_properties_and_the_audit_copy():
    rng = random.Random(16)
    for _ in range(2000):
        t = [rng.choice([0, rng.randint(0, 60)]) for _ in range(4)]
        ci = stats.newcombe_paired(*t)
        if sum(t) == 0:
            assert ci is None and audit_unc.paired_difference_ci(dict(zip(("11", "10", "01", "00"), t))) is None
            continue
        theta = (t[1] - t[2]) / sum(t)
        assert -1.0 <= ci[0] <= theta <= ci[1] <= 1.0, t
        swapped = stats.newcombe_paired(t[0], t[2], t[1], t[3])             # b vs a: the mirror image
        assert swapped == pytest.approx((-ci[1], -ci[0]), abs=1e-12)
        assert audit_unc.paired_difference_ci(dict(zip(("11", "10", "01", "00"), t))) == pytest.approx(ci, abs=1e-12)


def test_paired_entry_edges():
    empty = stats.paired_entry("a", "b", [])
    assert empty["difference"] is None and empty["difference_ci95"] is None and empty["mcnemar_p"] == 1.0
    assert "n = 0" in empty["reason"]
    same = stats.paired_entry("a", "b", [(True, True), (False, False), (True, True)])
    assert same["mcnemar_p"] == 1.0 and same["difference"] == 0.0 and same["only_a"] == same["only_b"] == 0
    assert audit_unc.paired_figures("a", "b", [], []) == empty


# ---- the audit's comparison: recomputed by formula, tolerance 1e-12 --------------------------------------------

def block():
    right_a = [1, 1, 0, 1, 0, 1, 1, 1, 0, 1]
    right_b = [1, 0, 0, 0, 0, 1, 0, 1, 0, 1]
    recorded = stats.uncertainty_block({"x/accuracy": (sum(right_a), 10), "empty/accuracy": (0, 0)},
                                       {"x_vs_y": ("x.accuracy", "y.accuracy", list(zip(right_a, right_b)))})
    expected = lambda rec: audit_unc.expected_block(rec, {"x/accuracy": (sum(right_a), 10),  # noqa: E731
                                                          "empty/accuracy": (0, 0)},
                                                    {"x_vs_y": ("x.accuracy", "y.accuracy", right_a, right_b)})
    return recorded, expected


def problems(recorded, expected):
    bad = []
    compare_tree(bad, "summary.json", recorded, expected(recorded), "uncertainty.")
    return bad


def test_audit_accepts_the_runners_block_and_catches_each_tamper():
    recorded, expected = block()
    assert problems(recorded, expected) == []
    tampers = {
        "wilson bound +1e-9": lambda b: b["accuracies"]["x/accuracy"]["wilson95"].__setitem__(0, b["accuracies"][
            "x/accuracy"]["wilson95"][0] + 1e-9),
        "p-value": lambda b: b["paired"]["x_vs_y"].update(mcnemar_p=0.2),
        "difference bound": lambda b: b["paired"]["x_vs_y"]["difference_ci95"].__setitem__(1, 0.9),
        "count": lambda b: b["paired"]["x_vs_y"].update(only_a=5),
        "method": lambda b: b.update(difference_interval="Newcombe method 11 (continuity corrected)"),
        "interval for n = 0": lambda b: b["accuracies"]["empty/accuracy"].update(wilson95=[0.0, 1.0]),
        "claim without a rule": lambda b: b["paired"]["x_vs_y"].update(odds_ratio=2.0),
    }
    for what, tamper in tampers.items():
        rec, _ = block()
        tamper(rec)
        assert problems(rec, expected), what


def test_audit_tolerance_is_1e_12():
    recorded, expected = block()
    lo = recorded["accuracies"]["x/accuracy"]["wilson95"][0]
    recorded["accuracies"]["x/accuracy"]["wilson95"][0] = lo + 1e-13      # another algebraic form: accepted
    recorded["paired"]["x_vs_y"]["mcnemar_p"] *= 1 + 1e-13
    assert problems(recorded, expected) == []
    recorded["paired"]["x_vs_y"]["mcnemar_p"] *= 1 + 1e-10
    assert len(problems(recorded, expected)) == 1


# ---- split all: every row in idx order, on both sides --------------------------------------------------------------

def test_split_all_is_every_row_in_idx_order():
    assert selection.select("all", "s", 200, 64, 128, 2) == list(range(200))
    assert selection.select("all", "s", 10, 64, 128, 2) == list(range(10))     # no rank range to fill
    assert audit_definitions.select_items("all", "s", 200, 64, 128, 2) == (list(range(200)), None)
    assert selection.confirmation_items_scored("all") and audit_definitions.confirmation_scored("all")
    assert not selection.confirmation_items_scored("dev") and not audit_definitions.confirmation_scored("dev")
    cfg = {"selection_salt": "s", "selection_rule": "r", "n_dev": 64, "n_confirm": 128, "n_smoke": 2}
    block_ = selection.selection_block(cfg, "all", list(range(5)))
    assert block_["split"] == "all" and block_["split_rule"] == selection.ALL_RULE
    assert "split_rule" not in selection.selection_block(cfg, "dev", [1])


def test_audit_checks_the_split_all_selection_block():
    from evidence_audit.shared import hash_selection_problems

    conf = {"selection_salt": "s", "selection_rule": "r", "n_dev": 64, "n_confirm": 128, "n_smoke": 2,
            "data": "d"}
    cfg = {"split": "all", "confirmation_items_scored": True, "data": "d", "n_rows": 200, "config": conf,
           "selection": selection.selection_block(conf, "all", list(range(200)))}
    bad = []
    hash_selection_problems(bad, cfg)
    assert bad == []
    cfg["confirmation_items_scored"] = False
    hash_selection_problems(bad, cfg)
    assert any("confirmation_items_scored" in b for b in bad)
    bad = []
    cfg["confirmation_items_scored"], cfg["selection"]["split"], cfg["split"] = False, "dev", "dev"
    hash_selection_problems(bad, cfg)
    assert any("split_rule" in b for b in bad)       # an all-rows rule under another split's name


def test_run_py_split_all_and_smoke_refusal(tmp_path, capsys):
    import run as run_py

    args = run_py.parse_args(["--cache", str(tmp_path), "--out", str(tmp_path / "o"), "--split", "all"])
    assert args.split == "all"
    with pytest.raises(SystemExit) as e:
        run_py.parse_args(["--cache", str(tmp_path), "--out", str(tmp_path / "o"), "--split", "all", "--smoke"])
    assert e.value.code == 2
    assert "cannot be combined with --split all" in capsys.readouterr().err


def test_mctaco_split_all_is_every_document_in_whole_questions():
    import types

    import config
    import resources
    from experiments import mctaco
    from experiments.context import Options

    rows = resources.read_mctaco_tsv(selection_fixture("mctaco_dev.tsv"))
    qs = resources.mctaco_questions(rows)
    ctx = types.SimpleNamespace(config=config.effective(mctaco.CONFIG_SECTIONS), split="all",
                                options=Options(out=selection_fixture(".")))
    docs, sel = mctaco.select_documents(ctx, rows, qs)
    assert docs == [r["idx"] for r in rows] == list(range(len(rows))) and sel["mode"] == "all"
    complete, cut = mctaco.group_status(docs, qs)
    assert cut == [] and len(complete) == len(qs)


def test_extraction_audit_sample_for_split_all_comes_from_every_row_before_any_model():
    """The pre-registration sees idx and labels of the scored items only: for split all, every row."""
    import types

    import config
    from experiments import extraction
    from experiments.extraction_sample import audit_rank_key

    rng = random.Random(3)
    rows = [{"idx": i, "label": rng.randint(0, 1), "sentence": f"s{i}"} for i in range(200)]
    conf = config.effective(extraction.CONFIG_SECTIONS)
    ctx = types.SimpleNamespace(config=conf, split="all",
                                data=types.SimpleNamespace(id="d", content_sha256="0" * 64))
    idx_list = selection.select_items(conf, "all", len(rows))
    prereg = extraction.preregistration(ctx, rows, idx_list)
    assert prereg["split"] == "all" and prereg["population"]["item_idx"] == list(range(200))
    per = conf["extraction_audit_per_class"]
    for label in (0, 1):
        members = [r["idx"] for r in rows if r["label"] == label]
        want = sorted(members, key=lambda i: audit_rank_key(conf["extraction_audit_salt"], i))[:per]
        assert [s["idx"] for s in prereg["items"] if s["label"] == label] == want
    # the development items are another population: the sample is drawn from the items that are scored
    dev = selection.select_items(conf, "dev", len(rows))
    assert extraction.preregistration(ctx, rows, dev)["population"]["item_idx"] == dev


def test_harness_says_what_split_all_means():
    from experiments import harness

    assert "every example" in harness.SPLIT_NOTES["all"]
    assert harness.SPLIT_NOTES.get("dev") is None


def selection_fixture(name):
    from pathlib import Path

    return Path(__file__).resolve().parent.parent / "fixtures" / name


def test_relabel_split_kind_handles_split_all(tmp_path):
    """The mutation self-test's relabel kind on split-all evidence: relabelled to dev, the all-rows rule dropped
    as a careful forger would (the selection rule then names the records that dev does not select)."""
    import json

    from evidence_audit.mutations import MUTATIONS

    kind = next(k for k in MUTATIONS if k.kind == "relabel_split")
    for name in ("config.json", "summary.json"):
        doc = {"split": "all", "confirmation_items_scored": True}
        if name == "config.json":
            doc["selection"] = {"split": "all", "split_rule": selection.ALL_RULE}
        (tmp_path / "protocol").mkdir(exist_ok=True)
        (tmp_path / "protocol" / name).write_text(json.dumps(doc))
    kind.apply(tmp_path)
    cfg = json.loads((tmp_path / "protocol" / "config.json").read_text())
    assert cfg["split"] == cfg["selection"]["split"] == "dev" and "split_rule" not in cfg["selection"]
    assert cfg["confirmation_items_scored"] is False


@pytest.mark.parametrize("table", [(5, 0, 0, 5), (100, 0, 0, 100), (37, 0, 0, 163), (200, 0, 0, 0), (0, 0, 0, 200),
                                   (0, 7, 9, 0), (60, 1, 1, 138), (100, 0, 1, 99)])
def test_newcombe_near_phi_1_has_no_cancellation(table):
    """No discordant pair (phi = 1): both implementations agree to 1e-15, with no +-1e-9 from a rounding residue
    under the square root (found on a tiny model whose two conditions always agree, at accuracy 0.5, where the
    interval is [0, 0]: with phi = 1 its half-widths are |(p - lo) - (hi - p)|, zero for a symmetric Wilson
    interval)."""
    ci = stats.newcombe_paired(*table)
    audit = audit_unc.paired_difference_ci(dict(zip(("11", "10", "01", "00"), table)))
    assert ci == pytest.approx(audit, abs=1e-15)
    if table[1] == table[2] == 0 and table[0] == table[3]:
        assert ci == pytest.approx((0.0, 0.0), abs=1e-15)
    assert ci == pytest.approx(newcombe_by_hand(*table), abs=1e-7)     # the textbook form, which loses digits
