"""A local Hugging Face causal-LM directory as a model input (run.py --model PATH): checked, hashed, identified.

The bottom layer: it imports resources (ResourceError, sha256_file) and nothing else of the repository.

What a directory must be, or it is refused on one line (ResourceError, exit 2) before anything loads:
- a directory of at most MAX_FILES regular files, each at most MAX_FILE_BYTES (MAX_TOTAL_BYTES in all), no deeper
  than MAX_DEPTH; a symlink whose target leaves the directory is refused (its bytes are not the directory's);
- config.json (at most MAX_CONFIG_BYTES, a JSON object) whose `architectures` are all causal language models:
  names in transformers' causal-LM auto mapping (LlamaForCausalLM, GPT2LMHeadModel, ...), never a BertModel
  (a config without `architectures` is judged by its model_type, which is what AutoModelForCausalLM reads);
  and no `auto_map` (custom code: trust_remote_code is never passed);
- weights in safetensors (*.safetensors). A directory whose weights are only pickles (.bin/.pt/.pth/.ckpt/.pkl) is
  refused: loading a pickle runs code. Both loaders are told use_safetensors=True (harness/hf_model.py
  from_pretrained_kwargs, which adapter.load_model uses, and experiments/official.hflm_args), so a pickle beside
  the safetensors is never read either;
- a fast tokenizer (tokenizer.json): lm-eval and the independent path load it through AutoTokenizer, the audit
  re-tokenises with it.

Identity (`local_identity`): every file is hashed (sha256, sorted relative paths). The run identity records the
per-file hashes ("files") and two hashes derived from them by HASH_RULE: model_sha256 over EVERY file of the
directory (weights, config, tokenizer and anything else), tokenizer_sha256 over the tokenizer files. The result
cache keys on model_sha256, so two directories that differ in any byte of any file never share a cached score.
The audit recomputes both from "files" (evidence_audit/model_files.py, written again on purpose).
"""
import json
import os
from pathlib import Path

from resources import ResourceError, sha256_file

MAX_FILES = 256
MAX_DEPTH = 4
MAX_FILE_BYTES = 64 << 30
MAX_TOTAL_BYTES = 256 << 30
MAX_CONFIG_BYTES = 1 << 20
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "chat_template.jinja")
HASH_RULE = ("sha256 of the UTF-8 lines f'{sha256}  {relative path}\\n' in sorted path order: model_sha256 over "
             "every file of the directory, tokenizer_sha256 over the files named " + ", ".join(TOKENIZER_FILES))


def listing_sha256(files, names=None):
    """HASH_RULE over `files` ({relative path: {"sha256": ...}}), restricted to `names` (top-level file names)."""
    import hashlib

    rels = sorted(r for r in files if names is None or r in names)
    return hashlib.sha256("".join(f"{files[r]['sha256']}  {r}\n" for r in rels).encode("utf-8")).hexdigest()


def list_files(root):
    """{relative path: Path} of every regular file under root, bounded (see the module docstring)."""
    root = Path(root).resolve()
    found, total = {}, 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        depth = len(here.relative_to(root).parts)
        for name in sorted(dirnames + filenames):
            path = here / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                target = path.resolve()
                if root != target and root not in target.parents:
                    raise ResourceError(f"{path}: a symlink to {target}, outside the model directory {root}; copy "
                                        "the files into the directory (symlinks leaving it are refused)")
                if target.is_dir():
                    raise ResourceError(f"{path}: a symlink to a directory; expected regular files only")
        if depth >= MAX_DEPTH and dirnames:
            raise ResourceError(f"{here}: nested more than {MAX_DEPTH} levels deep inside the model directory {root}")
        for name in sorted(filenames):
            path = here / name
            rel = path.relative_to(root).as_posix()
            if not path.resolve().is_file():
                raise ResourceError(f"{path}: not a regular file; expected only regular files in {root}")
            size = path.stat().st_size
            total += size
            if size > MAX_FILE_BYTES or total > MAX_TOTAL_BYTES:
                raise ResourceError(f"{path}: {size} bytes (directory total {total}); expected at most "
                                    f"{MAX_FILE_BYTES} per file and {MAX_TOTAL_BYTES} in all (local_model.py)")
            found[rel] = path
            if len(found) > MAX_FILES:
                raise ResourceError(f"{root}: more than {MAX_FILES} files; expected a model directory (config.json, "
                                    "*.safetensors, tokenizer files), not a whole repository or cache")
    return found


def causal_lm_architectures():
    """The architecture names of transformers' causal-LM auto mapping."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update([value] if isinstance(value, str) else value)
    return names


def read_config(root, files):
    """config.json as a dict, bounded and shape-checked."""
    path = Path(root) / "config.json"
    if "config.json" not in files:
        raise ResourceError(f"{path}: missing; expected a Hugging Face model directory (config.json, *.safetensors, "
                            "tokenizer.json)")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ResourceError(f"{path}: {path.stat().st_size} bytes, over {MAX_CONFIG_BYTES}; expected a model config")
    try:
        cfg = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ResourceError(f"{path}: not valid UTF-8 JSON ({str(e)[:100]})")
    if not isinstance(cfg, dict):
        raise ResourceError(f"{path}: a JSON {type(cfg).__name__}, expected an object")
    return cfg


def check_causal_lm(root, cfg):
    path = Path(root) / "config.json"
    arch = cfg.get("architectures")
    if arch is None and isinstance(cfg.get("model_type"), str):
        # no architectures (e.g. a config written by hand or by a converter, like prepare.py's): AutoModelForCausalLM
        # resolves the class from model_type, so that must name a causal LM
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        if cfg["model_type"] in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and "auto_map" not in cfg:
            return
        raise ResourceError(f"{path}: no architectures, and model_type {cfg['model_type']!r} is not in transformers' "
                            "causal-LM mapping (or auto_map names custom code); only causal LMs can be scored")
    if not (isinstance(arch, list) and arch and all(isinstance(a, str) for a in arch)):
        raise ResourceError(f"{path}: architectures {arch!r}; expected a list naming a causal language model "
                            "(e.g. LlamaForCausalLM, GPT2LMHeadModel)")
    known = causal_lm_architectures()
    wrong = [a for a in arch if a not in known]
    if wrong:
        raise ResourceError(f"{path}: architectures {wrong} is not a causal language model (transformers' causal-LM "
                            "mapping, e.g. LlamaForCausalLM, GPT2LMHeadModel); only causal LMs can be scored")
    if "auto_map" in cfg:
        raise ResourceError(f"{path}: auto_map names custom model code; remote or local custom code is never run "
                            "(trust_remote_code stays off)")


def check_weights_and_tokenizer(root, files):
    weights = [r for r in files if r.endswith(".safetensors")]
    pickles = [r for r in files if r.lower().endswith(PICKLE_SUFFIXES)]
    if not weights:
        what = (f"only pickled weights ({', '.join(sorted(pickles)[:3])})" if pickles else "no weights")
        raise ResourceError(f"{root}: {what}; expected *.safetensors (a pickle is never loaded: loading one runs "
                            "code; convert the weights to safetensors)")
    if "tokenizer.json" not in files:
        raise ResourceError(f"{Path(root) / 'tokenizer.json'}: missing; expected the model's fast tokenizer "
                            "(tokenizer.json) in the directory (a directory without a tokenizer is refused)")


def has_chat_template(model_dir):
    """True when the tokenizer files carry a chat template (tokenizer_config.json chat_template, or
    chat_template.jinja / chat_template.json beside it), as transformers reads it."""
    root = Path(model_dir)
    if (root / "chat_template.jinja").is_file() or (root / "chat_template.json").is_file():
        return True
    path = root / "tokenizer_config.json"
    if not path.is_file() or path.stat().st_size > 64 * MAX_CONFIG_BYTES:
        return False
    try:
        return bool(json.loads(path.read_bytes().decode("utf-8")).get("chat_template"))
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return False


def local_identity(model_dir):
    """Check the directory and hash every file: the model identity run.py records (identity.json, config.json
    "model") and the result cache keys on. Raises ResourceError (one line) for a directory that is refused."""
    root = Path(model_dir).resolve()
    files = list_files(root)
    cfg = read_config(root, files)
    check_causal_lm(root, cfg)
    check_weights_and_tokenizer(root, files)
    hashed = {rel: {"sha256": sha256_file(path), "size": path.stat().st_size} for rel, path in sorted(files.items())}
    return {"id": str(root), "dir": str(root), "source": "local", "files": hashed,
            "model_sha256": listing_sha256(hashed), "tokenizer_sha256": listing_sha256(hashed, TOKENIZER_FILES),
            "architectures": cfg.get("architectures"), "model_type": cfg.get("model_type"), "hash_rule": HASH_RULE}
