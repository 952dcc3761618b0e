"""The one model loader of the repository, and the check of a prepared cache for `python -m harness run --adapter
smollm2`.

Loading: `load_model` and `load_tokenizer` are how every model directory is loaded for the runner's own code and
for the harness CLI alike: adapter.load_model / adapter.load_tokenizer (experiments/, bench.py, run.py
--experiment harness) call them, and so does `python -m harness` (`load_hf_model`). The settings that can change
an output are the four of LOAD_SETTINGS: dtype, attention implementation, torch threads (process-wide) and device;
then safetensors only (a pickled .bin checkpoint is never loaded: loading a pickle runs code), no custom code, no
download (local files only) and eval mode. A failure to load is one line naming the directory (ModelLoadError),
never a library's traceback. One loader, so that a model the harness CLI loads is the model an experiment loads,
setting for setting.
adapter.load_tokenizer adds one SmolLM2-specific refusal (a tokenizer that prepends <|im_start|>), for local
directories; the CLI loads only a prepared cache's files, re-hashed against the manifest first.

This module is a leaf: it imports nothing from the repository, not even from the rest of harness/ (tests check
both), so adapter.py, a bottom-layer module, can import it without an import running upwards and the harness stays
usable alone.

The cache layout read here is prepare.py's contract: `<cache>/manifest.json` lists, per resource id, every file
(path relative to the cache, size, sha256), and a model lives in `<cache>/models/<id>/`, a Hugging Face directory.
"""
import hashlib
import json
from pathlib import Path

LOAD_SETTINGS = ("dtype", "attn_implementation", "threads", "device")


class ModelUnavailable(ValueError):
    """The model cannot be used: not prepared, or its files differ from the manifest. One line, naming the file."""


class ModelLoadError(OSError):
    """transformers could not load a model directory: one line naming the directory and what failed. An OSError (a
    directory that cannot be read as a model), so a caller mapping unreadable input to exit 2 catches it as such."""


def load_error(model_dir, what, error):
    """ModelLoadError for `error` raised while loading `what` from `model_dir`: its type and first line only (a
    library's message can run to many lines)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return ModelLoadError(f"{model_dir}: its {what} could not be loaded ({type(error).__name__}: "
                          f"{(lines[0] if lines else '')[:200]})")


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


def device_problem(device):
    """None when torch can run on `device` (cpu, or cuda / cuda:N with that GPU present), else why not."""
    import torch

    if device == "cpu":
        return None
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        if not torch.cuda.is_available():
            return "no CUDA device is available here (torch.cuda.is_available() is False); use --device cpu"
        index = int(device[5:]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            return f"cuda:{index} does not exist ({torch.cuda.device_count()} CUDA device(s))"
        return None
    return "expected cpu, cuda or cuda:N"


def from_pretrained_kwargs(dtype, attn_implementation):
    """The from_pretrained arguments that can change a score. use_safetensors=True: a pickled checkpoint (.bin) is
    never loaded, also where one lies beside the safetensors; trust_remote_code=False and local_files_only=True:
    no code from the directory and nothing from the network, only the directory's own files."""
    import torch

    return {"dtype": getattr(torch, dtype), "attn_implementation": attn_implementation, "use_safetensors": True,
            "trust_remote_code": False, "local_files_only": True}


def load_model(model_dir, *, dtype, attn_implementation, threads, device):
    """The causal LM of a Hugging Face directory on `device` in `dtype`, eval mode, with `threads` torch threads
    (torch.set_num_threads: process-wide, set before the weights load). Raises ModelLoadError (one line)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir),
                                                     **from_pretrained_kwargs(dtype, attn_implementation))
    except Exception as e:      # any library error: the directory is unusable, said on one line
        raise load_error(model_dir, "model", e) from None
    model.to(device)
    model.eval()
    return model


def load_tokenizer(model_dir):
    """The tokenizer of a Hugging Face directory, with its own special-token configuration (no custom code, local
    files only). Raises ModelLoadError (one line)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False, local_files_only=True)
    except Exception as e:      # any library error: the directory is unusable, said on one line
        raise load_error(model_dir, "tokenizer", e) from None


def load_hf_model(model_dir, settings):
    """(model, tokenizer) for the harness CLI; `settings` maps each of LOAD_SETTINGS to its value."""
    return load_model(model_dir, **{key: settings[key] for key in LOAD_SETTINGS}), load_tokenizer(model_dir)
