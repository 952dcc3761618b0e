"""A local model directory in the evidence (run.py --model PATH), and the agreement claim per device and dtype.

Written again here on purpose (the audit imports nothing of the runner):

- identity.json of a run on a local directory carries `model_source` "local" and `model_files` ({relative path:
  {"sha256", "size"}}, every file the loader reads: config.json, generation_config.json, the tokenizer files, the
  weights or the index and its shards); model_sha256 and tokenizer_sha256 are derived from them: the
  sha256 of the UTF-8 lines f"{sha256}  {path}\\n" in sorted path order, over every listed file (model) or over the
  tokenizer files named in TOKENIZER_FILES (tokenizer). The arithmetic level recomputes both and compares
  model_files with config.json's model.files; the identity and forward levels re-hash the files they read.
- summary.json "agreement_claim": "exact" (tolerance 0, and no prediction differs) on cpu, in every dtype (both
  paths ran the same batches through the same kernels); otherwise "within tolerance" against config.json's
  agreement_tolerance for the dtype. Recomputed from the records.
- `check_model_dir`: a --model DIR is checked before the audit loads anything from it (tokenizer.json for the
  token boundaries, config.json and model.safetensors for its own forward pass), so a hostile directory is one line
  and exit 2 (Unreadable), never a traceback or an allocation of terabytes. The rules are the runner's
  (local_model.py), written again, but for symlinks: the audit pins no model identity (lm-eval's output names
  none), it reads the bytes a symlink points at and checks them, so a Hugging Face cache snapshot (every file a
  symlink into ../../blobs) can be passed as it is. No index weight map may leave the directory; no pickle, code,
  PEFT adapter or unread .safetensors in it, no unknown top-level file; config.json's size fields positive integers
  whose parameters (2 bytes each) fit in physical memory; safetensors headers bounded, every tensor's bytes matching its
  dtype and shape inside the file, tiling the data, and for a Llama shaped as
  config.json says; tokenizer.json bounded JSON that the tokenizers library reads.
"""
import hashlib
import math
import os
import struct
from pathlib import Path

from evidence_audit.checks import MISSING, expect, get
from evidence_audit.reading import Unreadable, parse_strict, read_json, sha256_file

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


# ---- a --model DIR checked before anything is loaded from it ------------------------------------------------------

MAX_MODEL_FILES, MAX_MODEL_DEPTH = 256, 4
MAX_JSON_BYTES = 16 << 20               # config.json, tokenizer_config.json, the weight index, ...
MAX_TOKENIZER_BYTES = 128 << 20
MAX_HEADER_BYTES = 100 << 20            # a safetensors header (the safetensors library's own limit)
MAX_DIM = 1 << 31
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
CODE = (".py", ".pyc", ".so", ".dylib", ".dll")
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
READ_FILES = ("config.json", "generation_config.json", "chat_template.json", INDEX) + TOKENIZER_FILES
DOCS = (".gitattributes", ".gitignore")
DOC_PREFIXES = ("README", "LICENSE", "LICENCE", "NOTICE", "COPYING", "USE_POLICY")
ELEMENT_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                 "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_inner",
         "n_positions", "n_ctx", "d_model", "num_layers", "ffn_dim", "num_heads")
_CHECKED = {}   # the key check_model_dir computes -> the weight files it vouched for


def check_model_dir(model_dir):
    """Raise Unreadable (one line naming the directory or file) unless --model DIR may be read (module docstring).
    Checked once per directory, size and modification time of its files. Returns [Path] of the safetensors files
    that hold the weights: model.safetensors, or every shard its index names (each inside the directory); [] when
    neither."""
    root = Path(model_dir).resolve()
    if not root.is_dir():
        raise Unreadable(f"--model {model_dir}: not a directory")
    files = model_listing(root)
    key = (str(root),) + tuple((rel, p.stat().st_size, p.stat().st_mtime_ns) for rel, p in sorted(files.items()))
    if key in _CHECKED:
        return _CHECKED[key]
    shards = weight_files(root, files)
    refuse_unread(root, files, shards)
    cfg = read_json(root / "config.json", MAX_JSON_BYTES) if "config.json" in files else {}
    if not isinstance(cfg, dict):
        raise Unreadable(f"{root / 'config.json'}: a JSON {type(cfg).__name__}, expected an object")
    check_sizes(root, cfg)
    check_tokenizer_files(root, files)
    check_headers(root, cfg, shards)
    _CHECKED[key] = [root / rel for rel in shards]
    return _CHECKED[key]


def model_listing(root):
    """{relative path: Path} of the regular files under root (a symlink counts as the file it points at; a
    symlinked directory is not entered), bounded."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        if len(here.relative_to(root).parts) >= MAX_MODEL_DEPTH and dirnames:
            raise Unreadable(f"{here}: nested more than {MAX_MODEL_DEPTH} levels deep inside --model {root}")
        for name in sorted(filenames):
            path = here / name
            if name in filenames:
                if not path.resolve().is_file():
                    raise Unreadable(f"{path}: not a regular file; expected only regular files in {root}")
                found[path.relative_to(root).as_posix()] = path
        if len(found) > MAX_MODEL_FILES:
            raise Unreadable(f"{root}: more than {MAX_MODEL_FILES} files; expected a model directory")
    return found


def weight_files(root, files):
    """[model.safetensors] or the shards the index names (relative paths inside root), or [] when neither."""
    if WEIGHTS in files or INDEX not in files:
        return [WEIGHTS] if WEIGHTS in files else []
    index = read_json(root / INDEX, MAX_JSON_BYTES)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not (isinstance(weight_map, dict) and weight_map and all(isinstance(v, str) for v in weight_map.values())):
        raise Unreadable(f"{root / INDEX}: weight_map {str(weight_map)[:80]}; expected {{tensor name: shard file}}")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        parts = shard.split("/")
        if shard.startswith("/") or "\\" in shard or ".." in parts or "" in parts:
            raise Unreadable(f"{root / INDEX}: weight_map names {shard!r}, which leaves the model directory {root}; "
                             "expected shard files inside it")
        if shard not in files or not shard.endswith(".safetensors"):
            raise Unreadable(f"{root / INDEX}: weight_map names {shard!r}, not a .safetensors file of {root}")
    return shards


def refuse_unread(root, files, shards):
    """A file a loader might pick up that is neither read here nor documentation is refused."""
    for rel in sorted(files):
        low = rel.lower()
        if rel in shards or rel in READ_FILES or (rel.startswith("additional_chat_templates/")
                                                  and rel.endswith(".jinja")):
            continue
        if low.endswith(PICKLES):
            why = "a pickle (loading one runs code)"
        elif low.endswith(CODE):
            why = "code (custom model or tokenizer code)"
        elif rel.startswith("adapter_"):
            why = "a PEFT adapter (a loader would use it instead of these weights)"
        elif low.endswith(".safetensors"):
            why = "weights no loader reads here (a decoy)"
        elif "/" not in rel and not (rel in DOCS or low.endswith(".md") or rel.upper().startswith(DOC_PREFIXES)):
            why = "not a model file a loader reads nor documentation"
        else:
            continue
        raise Unreadable(f"{root / rel}: {why}; expected a model directory without it")


def config_sizes(root, cfg):
    """{field: value} of config.json's size fields, each a positive integer below MAX_DIM."""
    sizes = {}
    for key in SIZES:
        v = cfg.get(key)
        if v is None:
            continue
        if not (type(v) is int and 0 < v < MAX_DIM):
            raise Unreadable(f"{root / 'config.json'}: {key} {v!r}; expected a positive integer below {MAX_DIM}")
        sizes[key] = v
    return sizes


def check_sizes(root, cfg):
    """The parameters config.json implies within physical memory, at 2 bytes each (the bound refuses the absurd,
    not a model run in bfloat16): an estimate of embeddings in and out, positions, and per layer 4 h^2 of
    attention and 3 h i of a gated MLP."""
    sizes = config_sizes(root, cfg)

    def one(*keys, default=0):
        return next((sizes[k] for k in keys if k in sizes), default)

    h, layers = one("hidden_size", "n_embd", "d_model"), one("num_hidden_layers", "n_layer", "num_layers")
    inter = one("intermediate_size", "n_inner", "ffn_dim", default=4 * h)
    need = 2 * (2 * one("vocab_size") * h + one("max_position_embeddings", "n_positions") * h
                + layers * (4 * h * h + 3 * h * inter))
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if need > have:
        raise Unreadable(f"{root / 'config.json'}: {', '.join(f'{k}={v}' for k, v in sizes.items())} make about "
                         f"{need:.3g} bytes of parameters (2 bytes each), more than the {have:.3g} bytes of physical "
                         "memory; expected a model that fits")


def check_tokenizer_files(root, files):
    """tokenizer_config.json names no code or other file; the JSON files are bounded objects; tokenizer.json is one
    the tokenizers library reads."""
    for rel in ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "generation_config.json"):
        if rel not in files:
            continue
        obj = read_json(root / rel, MAX_JSON_BYTES)
        if not isinstance(obj, dict):
            raise Unreadable(f"{root / rel}: a JSON {type(obj).__name__}, expected an object")
        named = sorted(k for k, v in obj.items() if v is not None and (k.endswith(("_file", "_files"))
                                                                      or k == "auto_map"))
        if rel == "tokenizer_config.json" and named:
            raise Unreadable(f"{root / rel}: {', '.join(named)} set; expected no custom tokenizer code (auto_map) "
                             "and no other file to read (*_file, fast_tokenizer_files)")
    if "tokenizer.json" not in files:
        return
    path = root / "tokenizer.json"
    read_json(path, MAX_TOKENIZER_BYTES)       # bounded and strict before the library parses it
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(path))
    except Exception as e:      # the library raises its own exception types for a file it cannot read
        raise Unreadable(f"{path}: not a tokenizer the tokenizers library reads ({str(e)[:100]})")


def safetensors_header(path):
    """({tensor name: entry}, data bytes) of a safetensors file, the header bounded before it is read."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if n is None or n > MAX_HEADER_BYTES or 8 + n > size:
            raise Unreadable(f"{path}: safetensors header of {n} bytes in a file of {size}; expected a header of at "
                             f"most {MAX_HEADER_BYTES} bytes inside the file")
        raw = fh.read(n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable(f"{path}: safetensors header is not UTF-8") from None
    header = parse_strict(text.rstrip(" "), f"{path} (safetensors header)")
    if not isinstance(header, dict):
        raise Unreadable(f"{path}: safetensors header is a JSON {type(header).__name__}, expected an object")
    header.pop("__metadata__", None)
    return header, size - 8 - n


def tensor_span(path, name, e, data_bytes):
    """(begin, end, name) of one checked header entry (dtype, shape, offsets inside the data, bytes that match)."""
    ok = (isinstance(e, dict) and e.get("dtype") in ELEMENT_BYTES and isinstance(e.get("shape"), list)
          and len(e["shape"]) <= 8 and all(type(d) is int and 0 <= d < MAX_DIM for d in e["shape"])
          and isinstance(e.get("data_offsets"), list) and len(e["data_offsets"]) == 2
          and all(type(o) is int for o in e["data_offsets"]))
    if not ok:
        raise Unreadable(f"{path}: tensor {name!r}: header entry {str(e)[:100]}; expected dtype, shape and "
                         "data_offsets [begin, end]")
    begin, end = e["data_offsets"]
    if not 0 <= begin <= end or end > data_bytes:
        raise Unreadable(f"{path}: tensor {name!r}: data_offsets [{begin}, {end}] reach beyond the file's "
                         f"{data_bytes} data bytes")
    want = math.prod(e["shape"]) * ELEMENT_BYTES[e["dtype"]]
    if end - begin != want:
        raise Unreadable(f"{path}: tensor {name!r}: dtype {e['dtype']} shape {e['shape']} is {want} bytes, but its "
                         f"data_offsets span {end - begin}")
    return begin, end, name


def llama_tensor_shapes(cfg):
    """{tensor name: shape} config.json implies for a Llama (lm_head when untied; biases when configured), or {}
    for another architecture or an incomplete config."""
    if cfg.get("model_type") != "llama" or not all(type(cfg.get(k)) is int for k in (
            "hidden_size", "intermediate_size", "vocab_size", "num_attention_heads", "num_hidden_layers")):
        return {}
    h, i, v, nh = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    kv, hd = cfg.get("num_key_value_heads") or nh, cfg.get("head_dim") or h // nh
    out = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    if not cfg.get("tie_word_embeddings", False):
        out["lm_head.weight"] = [v, h]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                    p + "self_attn.q_proj.weight": [nh * hd, h], p + "self_attn.k_proj.weight": [kv * hd, h],
                    p + "self_attn.v_proj.weight": [kv * hd, h], p + "self_attn.o_proj.weight": [h, nh * hd],
                    p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h],
                    p + "mlp.down_proj.weight": [h, i]})
        if cfg.get("attention_bias"):
            out.update({p + "self_attn.q_proj.bias": [nh * hd], p + "self_attn.k_proj.bias": [kv * hd],
                        p + "self_attn.v_proj.bias": [kv * hd], p + "self_attn.o_proj.bias": [h]})
        if cfg.get("mlp_bias"):
            out.update({p + "mlp.gate_proj.bias": [i], p + "mlp.up_proj.bias": [i], p + "mlp.down_proj.bias": [h]})
    return out


def check_headers(root, cfg, shards):
    """Every weight file's header checked; a Llama's tensors as config.json shapes them (before the layout, so a
    missing tensor is named rather than its gap); the tensors tile each file's data (no overlap, gap, or tail)."""
    shapes, layouts = {}, []
    for shard in shards:
        path = root / shard
        header, data_bytes = safetensors_header(path)
        layouts.append((path, sorted(tensor_span(path, k, e, data_bytes) for k, e in header.items()), data_bytes))
        twice = sorted(set(header) & set(shapes))
        if twice:       # which copy a loader takes is its own choice: the audit could not say which weights ran
            raise Unreadable(f"{path}: tensor {twice[0]!r} is also in {shapes[twice[0]][1].name}; each tensor "
                             "belongs in one shard")
        shapes.update({k: (e["shape"], path) for k, e in header.items()})
    for name, shape in sorted(llama_tensor_shapes(cfg).items()):
        found = shapes.get(name)
        if found is None or found[0] != shape:
            where = found[1] if found else root / (shards[0] if len(shards) == 1 else INDEX)
            raise Unreadable(f"{where}: tensor {name!r}: expected shape {shape} (config.json), found "
                             f"{found[0] if found else 'no such tensor'}")
    for path, spans, data_bytes in layouts:
        at = 0
        for begin, end, name in spans:
            if begin != at:
                raise Unreadable(f"{path}: tensor {name!r} starts at data byte {begin}, expected {at} (tensors "
                                 "overlap or leave a gap)")
            at = end
        if at != data_bytes:
            raise Unreadable(f"{path}: the tensors end at data byte {at} but the file holds {data_bytes}")
