"""tools/measure_forward_sample.py: its pure parts (the weight count, the passes and tokens of a re-score, the fit,
the 7B MMLU arithmetic of docs/speed.md, the tables) on made-up figures; nothing here times anything or loads a
model."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evidence_audit import sampling

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "measure_forward_sample.py"
SMOLLM2_135M = {"hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536, "num_attention_heads": 9,
                "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152}


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("measure_forward_sample", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_matmul_weights_of_the_two_models(tool):
    # bench.py's docstring gives the 135M model's non-embedding matmul weights
    assert tool.matmul_weights(SMOLLM2_135M) == {"non_embedding": 106_168_320, "output_layer": 576 * 49152}
    w = tool.matmul_weights(tool.LLAMA_7B)
    assert w == {"non_embedding": 6_476_005_376, "output_layer": 131_072_000}
    # with the input embedding and the norms (2 * 4096 per layer + 4096) they make the 7B's parameter count
    assert w["non_embedding"] + 2 * w["output_layer"] + 65 * 4096 == tool.LLAMA_7B_PARAMETERS


def test_pass_tokens_groups_as_hflm(tool):
    """One pass per distinct context + candidate[:-1], of context + longest such candidate - 1 tokens."""
    m = tool
    assert m.pass_tokens([(20, [[5], [6]])]) == (1, 20)                    # one-token candidates share the pass
    assert m.pass_tokens([(20, [[5, 7], [5, 8]])]) == (1, 21)              # the same first token: one pass
    assert m.pass_tokens([(20, [[5, 7], [6, 7, 9]])]) == (2, 21 + 22)
    assert m.pass_tokens([(10, [[1]]), (30, [[1], [2]])]) == (2, 40)
    assert m.pass_tokens([]) == (0, 0)


def test_fit_separates_the_fixed_cost(tool):
    rows = [{"tokens": t, "cpu_s": 12.0 + 0.002 * t} for t in (100, 1000, 5000, 30000)]
    f = tool.fit(rows)
    assert f["fixed"] == pytest.approx(12.0) and f["per_unit"] == pytest.approx(0.002) and f["points"] == 4
    assert tool.fit(rows[:1]) is None
    assert tool.fit([{"tokens": 5, "cpu_s": 1.0}, {"tokens": 5, "cpu_s": 2.0}]) is None


def test_mmlu_subjects_and_the_sample_plan(tool):
    assert len(tool.MMLU_SUBJECTS) == 57 and sum(tool.MMLU_SUBJECTS.values()) == 14_042
    assert tool.mmlu_plan()[0] == 14_042
    drawn, rows = tool.mmlu_plan(200)
    assert drawn == sum(min(200, m) for m in tool.MMLU_SUBJECTS.values())
    law = next(r for r in rows if r[0] == "professional_law")
    assert law == ("professional_law", 200, 1534, sampling.detection_k(1534, 200))
    assert next(r for r in rows if r[0] == "anatomy") == ("anatomy", 135, 135, 1)     # n >= M: every question


def test_project_arithmetic(tool):
    p = tool.project(0.001, 100, 1000, passes=50, tokens_per_pass=4, rate_flops=2e3)
    assert p["tokens"] == 200 and p["weights_ratio"] == 10
    assert p["scaled_s"] == pytest.approx(0.001 * 10 * 200)
    assert p["floor_s"] == pytest.approx(2 * 1000 * 200 / 2e3)
    assert "= 2 s" in p["scaled_text"] and "200 tokens" in p["floor_text"]


def test_projections_cover_full_and_sampled(tool):
    out = tool.projections(0.0005, 134_479_872, cpu_flops=100e9)
    assert out["weights_7b"] == 6_476_005_376 + 131_072_000
    full = next(r for r in out["rows"] if r["shots"] == "0-shot" and r["n"] is None)
    assert full["passes"] == 14_042
    expect = 0.0005 * out["weights_7b"] / 134_479_872 * 14_042 * tool.MMLU_TOKENS["0-shot"]
    assert full["cpu"]["scaled_s"] == pytest.approx(expect)
    assert full["gpu_s"] == pytest.approx(2 * out["weights_7b"] * 14_042 * tool.MMLU_TOKENS["0-shot"]
                                          / tool.GPU_FLOPS)
    one = out["one_stratum"]
    assert (one["M"], one["n"], one["k"]) == (14_042, 200, sampling.detection_k(14_042, 200))
    assert one["rows"][0]["cpu"]["floor_s"] == pytest.approx(2 * out["weights_7b"] * 200 * 150 / 100e9)


def result():
    audit = {"wall_s": 30.5, "cpu_s": 25.0, "forward_s": 10.25, "peak_rss_mib": 1100.0, "load_before": 3.1,
             "load_after": 4.2, "items": 10, "population": 872, "passes": 10, "tokens": 350,
             "forward_s_per_token": 10.25 / 350, "strata": {"protocol": {"items": 10, "population": 872,
                                                                          "seconds": 10.25, "mode": "m"}}}
    return {"evidence": {"audits": [dict(audit, n=10), dict(audit, n=None, items=872)]},
            "lmeval": {"audits": [dict(audit, n=5, passes=None, tokens=None, forward_s_per_token=None,
                                       strata={"sst2": {"items": 5, "population": 200, "seconds": 1.5,
                                                        "mode": "one unpadded", "requests": 10}})]}}


def test_table(tool):
    text = tool.table(result())
    lines = text.splitlines()
    assert len(lines) == 5 and all(ln.startswith("|") and ln.endswith("|") for ln in lines)
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert ("| evidence | 10 | 10 (872) | 10 / 350 | 30.5 | 25.0 | 10.25 | 34% | 20.2 | 29.286 | 1,100 | "
            "3.10 / 4.20 |") in text
    assert "| evidence | full | 872 (872) |" in text and "| lmeval | 5 | 10 (872) | — |" in text
    assert "| 5 | sst2 | 5 (200) | 10 | 1.50 | one unpadded |" in tool.task_table(result())


def test_derived_figures(tool):
    r = result()
    r["evidence"]["audits"][1].update(tokens=30_000, cpu_s=85.0)
    d = tool.derived(r["evidence"], "tokens")
    assert d["fit_cpu"]["per_unit"] == pytest.approx(60.0 / 29_650)
    first = d["forward_cpu_s_per_unit"][0]
    assert first["forward_cpu_s"] == pytest.approx(25.0 * 10.25 / 30.5, abs=0.01)
    assert first["per_unit"] == pytest.approx(25.0 * 10.25 / 30.5 / 350)
    assert "evidence: cpu_s = " in tool.derived_text(r) and "evidence --sample full: forward rows ~" in \
        tool.derived_text(r)


def test_projection_text(tool):
    r = result()
    r["matmul_weights"] = tool.matmul_weights(SMOLLM2_135M)
    r["evidence"]["audits"][1].update(tokens=30_000, cpu_s=120.0, forward_s=100.0, wall_s=400.0)
    r["evidence"]["matmul_gflops_before"] = {"bfloat16@2": {"wall": 100.0, "per_cpu_s": 500.0},
                                             "float32@2": {"wall": 50.0, "per_cpu_s": 100.0}}
    text = tool.projection_text(r)
    assert "1.0000 ms CPU per token" in text and "0.5000 ms per token on 2 vCPUs" in text      # 30 CPU s / 30,000
    assert "200 GFLOP/s float32, 1,000 bfloat16 on 2 vCPUs" in text
    assert "| 0-shot (150 tokens) | full | 14,042 |" in text and "| 5-shot (800 tokens) | 200 | 9,183 |" in text
    assert f"k = {sampling.detection_k(14_042, 200)} " in text


def test_help_and_table_mode(tmp_path):
    proc = subprocess.run([sys.executable, str(TOOL), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage" in proc.stdout
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result()))
    proc = subprocess.run([sys.executable, str(TOOL), "--table", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "| evidence | full |" in proc.stdout
