"""A local model directory in the evidence (run.py --model PATH), and the agreement claim per device and dtype.

Written again here on purpose (the audit imports nothing of the runner):

- identity.json of a run on a local directory carries `model_source` "local" and `model_files` ({relative path:
  {"sha256", "size"}}, every file of the directory); model_sha256 and tokenizer_sha256 are derived from them: the
  sha256 of the UTF-8 lines f"{sha256}  {path}\\n" in sorted path order, over every file (model) or over the
  tokenizer files named in TOKENIZER_FILES (tokenizer). The arithmetic level recomputes both and compares
  model_files with config.json's model.files; the identity and forward levels re-hash the files they read.
- summary.json "agreement_claim": "exact" (tolerance 0, and no prediction differs) on cpu, in every dtype (both
  paths ran the same batches through the same kernels); otherwise "within tolerance" against config.json's
  agreement_tolerance for the dtype. Recomputed from the records.
"""
import hashlib
from pathlib import Path

from evidence_audit.checks import MISSING, expect, get
from evidence_audit.reading import sha256_file

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "chat_template.jinja")


def listing_sha256(files, names=None):
    rels = sorted(r for r in files if names is None or r in names)
    return hashlib.sha256("".join(f"{files[r]['sha256']}  {r}\n" for r in rels).encode("utf-8")).hexdigest()


def is_local(ident):
    return isinstance(ident, dict) and ident.get("model_source") == "local"


def local_identity_problems(bad, cfg, ident):
    """identity.json model_source / model_files against config.json's model block, and the two derived hashes
    recomputed from model_files. Nothing for a lock model (neither field present)."""
    if "model_source" not in ident and "model_files" not in ident:
        return
    expect(bad, "identity.json", "model_source", ident.get("model_source", MISSING), get(cfg, "model.source"),
           "config.json model.source")
    files = ident.get("model_files")
    expect(bad, "identity.json", "model_files", files, get(cfg, "model.files"), "config.json model.files")
    if not (isinstance(files, dict) and all(isinstance(v, dict) and isinstance(v.get("sha256"), str)
                                            for v in files.values())):
        bad.append("identity.json model_files: expected {path: {\"sha256\": ..., \"size\": ...}}")
        return
    expect(bad, "identity.json", "model_sha256", ident.get("model_sha256", MISSING), listing_sha256(files),
           "derived from model_files (every file)")
    expect(bad, "identity.json", "tokenizer_sha256", ident.get("tokenizer_sha256", MISSING),
           listing_sha256(files, TOKENIZER_FILES), "derived from model_files (tokenizer files)")


def rehash_problems(bad, model_dir, ident, names):
    """Re-hash the files `names` (relative paths) of a local model directory against identity.json model_files."""
    files = ident.get("model_files") if isinstance(ident.get("model_files"), dict) else {}
    for rel in names:
        path = Path(model_dir) / rel
        want = files.get(rel, {}).get("sha256", MISSING) if isinstance(files.get(rel), dict) else MISSING
        got = sha256_file(path) if path.is_file() and not path.is_symlink() else MISSING
        expect(bad, str(path), "sha256", got, want, "identity.json model_files: the local file is not the one used")


def expected_agreement_claim(conf, max_abs_diff, n_prediction_mismatches):
    """summary.json agreement_claim as config.json's device, dtype and agreement_tolerance and the records say."""
    device, dtype = conf.get("device", MISSING), conf.get("dtype", MISSING)
    exact = device == "cpu"
    tolerances = conf.get("agreement_tolerance") if isinstance(conf.get("agreement_tolerance"), dict) else {}
    tolerance = 0.0 if exact else tolerances.get(dtype, MISSING)
    passed = (isinstance(tolerance, float) and isinstance(max_abs_diff, float) and max_abs_diff <= tolerance
              and (n_prediction_mismatches == 0 or not exact))
    return {"device": device, "dtype": dtype, "claim": "exact" if exact else "within tolerance",
            "tolerance": tolerance, "max_abs_diff": max_abs_diff, "passed": passed}
