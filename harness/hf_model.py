"""The model for `python -m harness run --adapter smollm2`: a directory prepared by prepare.py, checked and loaded
here without importing the repository's modules (run.py --experiment harness loads it through adapter.py instead).

The cache layout read here is prepare.py's contract: `<cache>/manifest.json` lists, per resource id, every file
(path relative to the cache, size, sha256), and a model lives in `<cache>/models/<id>/`, a Hugging Face directory.
Loading uses the same settings as adapter.load_model (dtype, attention implementation, torch threads, eval
mode), given as CLI flags whose defaults are config.py's values (tests/test_harness.py checks they agree).
"""
import hashlib
import json
from pathlib import Path


class ModelUnavailable(ValueError):
    """The model cannot be used: not prepared, or its files differ from the manifest. One line, naming the file."""


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_prepared_model(cache, model_id):
    """Re-hash every file the cache manifest lists for `model_id`; return the model directory."""
    manifest_file = Path(cache) / "manifest.json"
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        files = manifest["resources"][model_id]["files"]
    except FileNotFoundError:
        raise ModelUnavailable(f"{manifest_file}: missing; prepare the cache with prepare.py --cache {cache}") \
            from None
    except (ValueError, KeyError, TypeError):
        raise ModelUnavailable(f"{manifest_file}: no prepared model {model_id!r} listed") from None
    for rel, meta in sorted(files.items()):
        path = Path(cache) / rel
        if not path.is_file() or path.stat().st_size != meta["size"] or sha256_file(path) != meta["sha256"]:
            raise ModelUnavailable(f"{path}: missing or changed since prepare (model {model_id}, expected sha256 "
                                   f"{meta['sha256']}); run prepare.py --cache {cache} again")
    return Path(cache) / "models" / model_id


def load_hf_model(model_dir, dtype, attn_implementation, threads):
    """(model, tokenizer) from a Hugging Face directory, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype),
                                                 attn_implementation=attn_implementation)
    model.eval()
    return model, tokenizer
