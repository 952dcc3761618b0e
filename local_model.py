"""A local Hugging Face causal-LM directory as a model input (run.py --model PATH): checked, hashed, identified.

The bottom layer: it imports resources (ResourceError, sha256_file) and nothing else of the repository.

Every byte that can change a score must be inside the directory and in the identity. transformers' from_pretrained
(model and tokenizer) reads, from a directory: config.json, generation_config.json, the tokenizer files
(LOADER_FILES), additional_chat_templates/*.jinja, and the weights: model.safetensors, or the shards that
model.safetensors.index.json names. Those are the "loader files"; they are hashed and nothing else is. A directory
is refused on one line (ResourceError, exit 2) before anything loads when:
- it holds more than MAX_FILES files, one over MAX_FILE_BYTES (MAX_TOTAL_BYTES in all), deeper than MAX_DEPTH, or
  a symlink whose target leaves it;
- a file the loader might pick up is not a loader file: a pickle anywhere (.bin/.pt/... : loading one runs code,
  and use_safetensors=True is only the loaders' promise), code anywhere (.py: custom code is never run), a PEFT
  adapter (adapter_config.json: transformers would load the adapter and its base model instead), a .safetensors
  the loader does not read (a decoy), or any other top-level file that is neither a loader file nor documentation
  (README/LICENSE/*.md, .gitattributes: never read). Nested files outside those kinds are never read and ignored;
- the weights are not model.safetensors or an index whose every shard is a relative path inside the directory
  (an absolute path or `..` in the weight map is refused: those bytes would be loaded and never hashed);
- config.json (bounded JSON, no NaN) does not name a causal LM, names custom code (auto_map), has a size field
  that is not a positive integer below MAX_DIM, or implies more parameter bytes than the physical memory (at 2
  bytes each, the smallest dtype a run loads in: the bound refuses the absurd, not a model run in bfloat16);
- a safetensors header is over MAX_HEADER_BYTES or the file, names an unknown dtype, has a tensor whose bytes do
  not match its dtype and shape, data offsets beyond the file, overlapping or leaving gaps, or (for a Llama) a
  tensor missing or shaped otherwise than config.json says (transformers would silently initialise it randomly,
  or fail allocating);
- tokenizer.json is missing, over MAX_TOKENIZER_BYTES, or does not parse (JSON, then the tokenizers library
  itself); tokenizer_config.json names custom code (auto_map) or other files to read (`*_file`,
  fast_tokenizer_files);
- transformers itself cannot parse the config, build the model it describes (on the meta device: no memory) or
  load the tokenizer (check_transformers_reads): found here rather than as a traceback inside an experiment.

Identity (`local_identity`): the loader files are hashed (sha256, sorted relative paths). The run identity records
the per-file hashes ("files") and two hashes derived from them by HASH_RULE: model_sha256 over every loader file
(weights, config, tokenizer), tokenizer_sha256 over the tokenizer files. The result cache keys on model_sha256, so
two directories that differ in any byte the loader reads never share a cached score. The audit recomputes both
from "files" (evidence_audit/model_files.py, written again on purpose).
"""
import json
import math
import os
import struct
from pathlib import Path

from resources import ResourceError, sha256_file

MAX_FILES = 256
MAX_DEPTH = 4
MAX_FILE_BYTES = 64 << 30
MAX_TOTAL_BYTES = 256 << 30
MAX_CONFIG_BYTES = 1 << 20
MAX_JSON_BYTES = 16 << 20           # tokenizer_config.json, special_tokens_map.json, the weight index, ...
MAX_TOKENIZER_BYTES = 128 << 20     # tokenizer.json (large vocabularies are tens of MB)
MAX_HEADER_BYTES = 100 << 20        # a safetensors header (the safetensors library's own limit)
MAX_DIM = 1 << 31                   # any size field of config.json
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
CODE_SUFFIXES = (".py", ".pyc", ".so", ".dylib", ".dll")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "chat_template.jinja")
LOADER_FILES = ("config.json", "generation_config.json", "chat_template.json") + TOKENIZER_FILES
WEIGHTS, INDEX, CHAT_TEMPLATE_DIR = "model.safetensors", "model.safetensors.index.json", "additional_chat_templates"
DOC_NAMES = (".gitattributes", ".gitignore")
DOC_PREFIXES = ("README", "LICENSE", "LICENCE", "NOTICE", "COPYING", "USE_POLICY")
# bytes per element of each safetensors dtype
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
# the config.json fields that size a model, under their names across architectures
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "n_embd", "n_layer", "n_head",
               "n_inner", "n_positions", "n_ctx", "d_model", "num_layers", "ffn_dim", "num_heads")
HASH_RULE = ("sha256 of the UTF-8 lines f'{sha256}  {relative path}\\n' in sorted path order: model_sha256 over "
             "every file the loader reads (config.json, generation_config.json, the tokenizer files, "
             "additional_chat_templates/*.jinja, model.safetensors or the index and its shards), tokenizer_sha256 "
             "over the files named " + ", ".join(TOKENIZER_FILES))


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


def no_constant(name):
    raise ValueError(f"non-finite number {name}")


def read_json_object(path, limit):
    """A JSON object from `path`: at most `limit` bytes, strict UTF-8, no NaN/Infinity, nesting within Python's
    recursion limit. One-line ResourceError otherwise."""
    size = path.stat().st_size
    if size > limit:
        raise ResourceError(f"{path}: {size} bytes, over {limit}; expected a model directory's JSON file")
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"), parse_constant=no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ResourceError(f"{path}: not valid UTF-8 JSON ({str(e)[:100]})")
    if not isinstance(obj, dict):
        raise ResourceError(f"{path}: a JSON {type(obj).__name__}, expected an object")
    return obj


def read_config(root, files):
    """config.json as a dict, bounded and shape-checked."""
    path = Path(root) / "config.json"
    if "config.json" not in files:
        raise ResourceError(f"{path}: missing; expected a Hugging Face model directory (config.json, *.safetensors, "
                            "tokenizer.json)")
    return read_json_object(path, MAX_CONFIG_BYTES)


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
    """The loader's weights (model.safetensors or the index) and tokenizer.json are at the top of the directory."""
    if WEIGHTS not in files and INDEX not in files:
        pickles = sorted(r for r in files if r.lower().endswith(PICKLE_SUFFIXES))
        what = (f"only pickled weights ({', '.join(pickles[:3])})" if pickles else f"no {WEIGHTS} or {INDEX}")
        raise ResourceError(f"{root}: {what}; expected {WEIGHTS} (or {INDEX} and its shards) at the top of the "
                            "directory (a pickle is never loaded: loading one runs code; convert the weights to "
                            "safetensors)")
    if WEIGHTS in files and INDEX in files:
        raise ResourceError(f"{root}: both {WEIGHTS} and {INDEX}; expected one (the loader would read "
                            f"{WEIGHTS} and ignore the index's shards)")
    if "tokenizer.json" not in files:
        raise ResourceError(f"{Path(root) / 'tokenizer.json'}: missing; expected the model's fast tokenizer "
                            "(tokenizer.json) in the directory (a directory without a tokenizer is refused)")


def shard_names(root, files):
    """The weight files the loader reads: [model.safetensors], or the shards the index names, each a relative path
    inside the directory (an absolute path or `..` would load bytes that are never hashed)."""
    if WEIGHTS in files:
        return [WEIGHTS]
    path = Path(root) / INDEX
    index = read_json_object(path, MAX_JSON_BYTES)
    weight_map = index.get("weight_map")
    if not (isinstance(weight_map, dict) and weight_map
            and all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())):
        raise ResourceError(f"{path}: weight_map {str(weight_map)[:80]}; expected {{tensor name: shard file}}")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        parts = shard.split("/")
        inside = (Path(root) / shard).resolve()
        if (shard.startswith("/") or "\\" in shard or ".." in parts or "" in parts
                or Path(root).resolve() not in inside.parents):
            raise ResourceError(f"{path}: weight_map names {shard!r}, which leaves the model directory {root}; "
                                "expected shard files inside it (their bytes must be hashed into the identity)")
        if shard not in files or not shard.endswith(".safetensors"):
            raise ResourceError(f"{path}: weight_map names {shard!r}, not a .safetensors file of {root}")
    return shards


def is_doc(rel):
    """Documentation at the top of the directory: never read by a loader."""
    return rel in DOC_NAMES or rel.endswith(".md") or rel.upper().startswith(DOC_PREFIXES)


def loader_files(root, files, shards):
    """The relative paths the loader reads (hashed); refuses every file it might pick up that is not one of them
    (module docstring). Nested files of no refused kind are never read: left out."""
    read = set(shards) | {r for r in LOADER_FILES + (INDEX,) if r in files}
    read |= {r for r in files if r.startswith(CHAT_TEMPLATE_DIR + "/") and r.endswith(".jinja")}
    for rel in sorted(files):
        path, low = Path(root) / rel, rel.lower()
        if rel in read:
            continue
        if low.endswith(PICKLE_SUFFIXES):
            why = "a pickle: pickled files are refused in a model directory (loading one runs code)"
        elif low.endswith(CODE_SUFFIXES):
            why = "code: custom model or tokenizer code is never run (trust_remote_code stays off)"
        elif rel.startswith("adapter_"):
            why = "a PEFT adapter: transformers would load the adapter and its base model instead of these weights"
        elif low.endswith(".safetensors"):
            why = f"weights the loader does not read (neither {WEIGHTS} nor a shard {INDEX} names): a decoy"
        elif "/" not in rel and not is_doc(rel):
            why = ("not a file the loader reads (" + ", ".join(LOADER_FILES) + ", the weights) nor documentation: "
                   "a loader might pick it up and it would not be in the identity")
        else:
            continue
        raise ResourceError(f"{path}: {why}; remove it from the model directory")
    return sorted(read)


def size_fields(root, cfg):
    """{field: value} of config.json's size fields; each present one must be a positive integer below MAX_DIM."""
    sizes = {}
    for key in SIZE_FIELDS:
        value = cfg.get(key)
        if value is None:
            continue
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 < value < MAX_DIM):
            raise ResourceError(f"{Path(root) / 'config.json'}: {key} {value!r}; expected a positive integer below "
                                f"{MAX_DIM}")
        sizes[key] = value
    return sizes


def first(sizes, *keys, default=0):
    return next((sizes[k] for k in keys if k in sizes), default)


def parameter_bytes(sizes):
    """An estimate of the parameter bytes (2 each) the config implies (embeddings in and out, positions, and per
    layer attention 4 h^2 and a gated MLP 3 h i): enough to refuse an absurd config before allocating it."""
    h = first(sizes, "hidden_size", "n_embd", "d_model")
    layers = first(sizes, "num_hidden_layers", "n_layer", "num_layers")
    inter = first(sizes, "intermediate_size", "n_inner", "ffn_dim", default=4 * h)
    vocab, positions = first(sizes, "vocab_size"), first(sizes, "max_position_embeddings", "n_positions")
    return 2 * (2 * vocab * h + positions * h + layers * (4 * h * h + 3 * h * inter))


def physical_memory():
    """Bytes of physical memory, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_size(root, cfg):
    """config.json's size fields bounded, and the parameters they imply within physical memory."""
    sizes = size_fields(root, cfg)
    need, have = parameter_bytes(sizes), physical_memory()
    if have is not None and need > have:
        shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
        raise ResourceError(f"{Path(root) / 'config.json'}: {shown} make about {need:.3g} bytes of parameters "
                            f"(2 bytes each), more than the {have:.3g} bytes of physical memory; expected a model "
                            "that fits")


def llama_shapes(cfg):
    """{tensor name: shape} a Llama checkpoint must hold, as config.json sizes it (lm_head when not tied;
    biases when attention_bias / mlp_bias)."""
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    kv, hd = cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or h // heads
    shapes = {"model.embed_tokens.weight": [vocab, h], "model.norm.weight": [h]}
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = [vocab, h]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                       p + "self_attn.q_proj.weight": [heads * hd, h], p + "self_attn.k_proj.weight": [kv * hd, h],
                       p + "self_attn.v_proj.weight": [kv * hd, h], p + "self_attn.o_proj.weight": [h, heads * hd],
                       p + "mlp.gate_proj.weight": [inter, h], p + "mlp.up_proj.weight": [inter, h],
                       p + "mlp.down_proj.weight": [h, inter]})
        if cfg.get("attention_bias"):
            shapes.update({p + "self_attn.q_proj.bias": [heads * hd], p + "self_attn.k_proj.bias": [kv * hd],
                           p + "self_attn.v_proj.bias": [kv * hd], p + "self_attn.o_proj.bias": [h]})
        if cfg.get("mlp_bias"):
            shapes.update({p + "mlp.gate_proj.bias": [inter], p + "mlp.up_proj.bias": [inter],
                           p + "mlp.down_proj.bias": [h]})
    return shapes


def expected_shapes(root, cfg):
    """llama_shapes for a Llama config, else None (other architectures: the headers are checked for bounds and
    consistency only)."""
    needed = ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads", "num_hidden_layers")
    if cfg.get("model_type") != "llama" or not all(k in cfg for k in needed):
        return None
    return llama_shapes(cfg)


def tensor_entry(path, name, entry, data_bytes):
    """(begin, end) of one header entry, checked: known dtype, shape of non-negative integers, offsets inside the
    data and spanning exactly dtype size x elements."""
    if not (isinstance(entry, dict) and entry.get("dtype") in DTYPE_BYTES and isinstance(entry.get("shape"), list)
            and len(entry["shape"]) <= 8 and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < MAX_DIM
                                                 for d in entry["shape"])
            and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in entry["data_offsets"])):
        raise ResourceError(f"{path}: tensor {name!r}: header entry {str(entry)[:100]}; expected dtype (one of "
                            f"{', '.join(DTYPE_BYTES)}), shape and data_offsets [begin, end]")
    begin, end = entry["data_offsets"]
    if not 0 <= begin <= end or end > data_bytes:
        raise ResourceError(f"{path}: tensor {name!r}: data_offsets [{begin}, {end}] reach beyond the file's "
                            f"{data_bytes} data bytes")
    want = math.prod(entry["shape"]) * DTYPE_BYTES[entry["dtype"]]
    if end - begin != want:
        raise ResourceError(f"{path}: tensor {name!r}: dtype {entry['dtype']} shape {entry['shape']} is {want} "
                            f"bytes, but its data_offsets span {end - begin}")
    return begin, end


def read_header(path):
    """{tensor name: header entry} of a safetensors file, the header bounded before it is read."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if n is None or n > MAX_HEADER_BYTES or 8 + n > size:
            raise ResourceError(f"{path}: safetensors header of {n} bytes in a file of {size}; expected a header "
                                f"of at most {MAX_HEADER_BYTES} bytes inside the file")
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ResourceError(f"{path}: safetensors header is not UTF-8 JSON ({str(e)[:100]})")
    if not isinstance(header, dict):
        raise ResourceError(f"{path}: safetensors header is a JSON {type(header).__name__}, expected an object")
    header.pop("__metadata__", None)
    return header, size - 8 - n


def check_layout(path, spans, data_bytes):
    """The tensors' byte ranges tile the data section: no overlap, no gap, nothing after the last."""
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise ResourceError(f"{path}: tensor {name!r} starts at data byte {begin}, expected {at} (tensors "
                                "overlap or leave a gap)")
        at = end
    if at != data_bytes:
        raise ResourceError(f"{path}: the tensors end at data byte {at} but the file holds {data_bytes}")


def check_weights(root, cfg, shards):
    """Every shard's header bounded and consistent with the file; for a Llama, every tensor config.json implies
    present with that shape (checked before the layout, so a missing tensor is named rather than its gap)."""
    shapes, layouts = {}, []
    for shard in shards:
        path = Path(root) / shard
        header, data_bytes = read_header(path)
        spans = [(*tensor_entry(path, name, entry, data_bytes), name) for name, entry in header.items()]
        layouts.append((path, spans, data_bytes))
        twice = sorted(set(header) & set(shapes))
        if twice:       # which copy a loader takes is its own choice: the identity could not say which weights ran
            raise ResourceError(f"{path}: tensor {twice[0]!r} is also in {shapes[twice[0]][1].name}; each tensor "
                                "belongs in one shard")
        shapes.update({name: (entry["shape"], path) for name, entry in header.items()})
    for name, shape in sorted((expected_shapes(root, cfg) or {}).items()):
        found = shapes.get(name)
        where = found[1] if found else Path(root) / (shards[0] if len(shards) == 1 else INDEX)
        if found is None or found[0] != shape:
            raise ResourceError(f"{where}: tensor {name!r}: expected shape {shape} (config.json), found "
                                f"{found[0] if found else 'no such tensor'}")
    for layout in layouts:
        check_layout(*layout)


def check_tokenizer(root, files):
    """tokenizer.json parses (bounded JSON, then the tokenizers library); tokenizer_config.json names no custom
    code and no other files to read; the other JSON loader files are bounded objects."""
    for rel in ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "generation_config.json",
                "chat_template.json"):
        if rel in files:
            obj = read_json_object(Path(root) / rel, MAX_JSON_BYTES)
            if rel == "tokenizer_config.json":
                check_tokenizer_config(Path(root) / rel, obj)
    path = Path(root) / "tokenizer.json"
    read_json_object(path, MAX_TOKENIZER_BYTES)
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(path))
    except Exception as e:      # the library raises its own exception types for a file it cannot read
        raise ResourceError(f"{path}: not a tokenizer the tokenizers library reads ({str(e)[:100]})")


def check_tokenizer_config(path, obj):
    named = [k for k, v in obj.items() if v is not None and (k.endswith(("_file", "_files")) or k == "auto_map")]
    if named:
        raise ResourceError(f"{path}: {', '.join(sorted(named))} set; expected no custom tokenizer code (auto_map) "
                            "and no other file to read (*_file, fast_tokenizer_files): only the directory's own "
                            "tokenizer files are read and hashed")


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


def first_line(error):
    """An exception's type and first non-empty line (a library's message can run to many lines)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {(lines[0] if lines else '')[:200]}"


def check_transformers_reads(root):
    """What transformers itself refuses in config.json or the tokenizer files, found now on one line rather than as
    a traceback inside an experiment: the config parsed, the model built on the meta device (no memory, no
    weights), the tokenizer loaded. Custom code and downloads stay off."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(str(root), trust_remote_code=False, local_files_only=True)
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as e:      # any library error: the directory is unusable
        raise ResourceError(f"{root / 'config.json'}: transformers cannot build the model it describes "
                            f"({first_line(e)})") from None
    try:
        AutoTokenizer.from_pretrained(str(root), trust_remote_code=False, local_files_only=True)
    except Exception as e:      # any library error: the directory is unusable
        raise ResourceError(f"{root}: transformers cannot load its tokenizer ({first_line(e)})") from None


def local_identity(model_dir):
    """Check the directory and hash the files the loader reads: the model identity run.py records (identity.json,
    config.json "model") and the result cache keys on. Raises ResourceError (one line) for a directory that is
    refused (module docstring)."""
    root = Path(model_dir).resolve()
    files = list_files(root)
    cfg = read_config(root, files)
    check_causal_lm(root, cfg)
    check_weights_and_tokenizer(root, files)
    shards = shard_names(root, files)
    read = loader_files(root, files, shards)
    check_size(root, cfg)
    check_tokenizer(root, files)
    check_weights(root, cfg, shards)
    check_transformers_reads(root)
    hashed = {rel: {"sha256": sha256_file(files[rel]), "size": files[rel].stat().st_size} for rel in read}
    return {"id": str(root), "dir": str(root), "source": "local", "files": hashed,
            "model_sha256": listing_sha256(hashed), "tokenizer_sha256": listing_sha256(hashed, TOKENIZER_FILES),
            "architectures": cfg.get("architectures"), "model_type": cfg.get("model_type"), "hash_rule": HASH_RULE}
