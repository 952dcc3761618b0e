"""The identity level's shared groups: private texts, the tokenizer (loaded straight from the cache's
tokenizer.json), candidate tokenisation, and the SST-2-shaped data parquet. tokenizers and pyarrow are imported
inside the functions that need them: the arithmetic level never imports them."""
from pathlib import Path

from evidence_audit.checks import IDENTITY, MISSING, expect, short
from evidence_audit.definitions import is_int
from evidence_audit.model_files import TOKENIZER_FILES, is_local, rehash_problems
from evidence_audit.reading import Unreadable, read_json, read_jsonl, sha256_file, sha256_text

TOKENISATION = "tokenisation (candidate ids, start, context-prefix property)"
_TOKENIZERS = {}


def load_tokenizer(path):
    """tokenizers.Tokenizer straight from tokenizer.json (what AutoTokenizer's fast tokenizer wraps); no special
    tokens are added at encode time."""
    key = (str(Path(path).resolve()), Path(path).stat().st_mtime_ns)
    if key not in _TOKENIZERS:
        from tokenizers import Tokenizer
        _TOKENIZERS[key] = Tokenizer.from_file(str(path))
    return _TOKENIZERS[key]


def private_texts(out, name, records, valid, needs, file="texts.jsonl"):
    """O/private/<name>/<file> as {idx: row}, or None when absent (private evidence not shipped), and the
    problems: lines that fail `valid` (`needs` says what a line must hold), duplicated idx, records without a row
    and rows without a record. Messages call the file's rows "private texts" (texts.jsonl) or "private <stem>"."""
    path = out / "private" / name / file
    if not path.exists():
        return None, []
    what = "private texts" if file == "texts.jsonl" else f"private {Path(file).stem}"
    bad, texts = [], {}
    for n_line, t in enumerate(read_jsonl(path), start=1):
        if not (isinstance(t, dict) and is_int(t.get("idx")) and valid(t)):
            bad.append(f"private/{name}/{file} line {n_line}: needs {needs} ({short(t, 60)})")
            continue
        if t["idx"] in texts:
            bad.append(f"idx {t['idx']} {what}: duplicated (line {n_line})")
        texts[t["idx"]] = t
    rec_idx = list(dict.fromkeys(r["idx"] for r in records))
    bad += [f"idx {i} {what}: no row for this record" for i in rec_idx if i not in texts]
    bad += [f"idx {i} {what}: a row for an idx with no record" for i in texts if i not in rec_idx]
    return texts, bad


def private_texts_check(C, name, out, records, valid, needs, check, unchecked, text_problems):
    """Row `check`: private_texts (texts.jsonl), then `text_problems(bad, where, record, text)` for every record
    that has a text. SKIPPED when the file is absent, saying what is then NOT checked (`unchecked`). Returns the
    texts by idx, or None."""
    texts, bad = private_texts(out, name, records, valid, needs)
    if texts is None:
        C.skip(name, IDENTITY, check, f"{out / 'private' / name / 'texts.jsonl'} absent (private evidence not "
                                      f"shipped); {unchecked} NOT checked")
        return None
    for r in records:
        if r["idx"] in texts:
            text_problems(bad, f"idx {r['idx']}", r, texts[r["idx"]])
    C.add(name, IDENTITY, check, len(records), bad)
    return texts


def tokenizer_or_skip(C, name, check, model_dir, ident, bad):
    """The cached tokenizer, its sha256 compared with identity.json's (into `bad`); or None after a SKIPPED row
    `check` saying why it is not available."""
    tok_path = model_dir / "tokenizer.json" if model_dir else None
    if tok_path is None or not tok_path.exists():
        C.skip(name, IDENTITY, check, f"tokenizer not found ({tok_path}); pass --cache with the prepared cache (a "
               "local model: --model DIR)")
        return None
    try:
        tok = load_tokenizer(tok_path)
    except ImportError as e:
        C.skip(name, IDENTITY, check, f"cannot import tokenizers ({e})")
        return None
    if is_local(ident):     # a local --model directory: every tokenizer file it had, re-hashed
        rehash_problems(bad, model_dir, ident, [r for r in sorted(ident.get("model_files") or {})
                                                if r in TOKENIZER_FILES])
        return tok
    expect(bad, str(tok_path), "sha256", sha256_file(tok_path), ident.get("tokenizer_sha256", MISSING)
           if ident else MISSING, "identity.json tokenizer_sha256: the cached tokenizer is not the one used")
    return tok


def encode(tok, text):
    """The ids of `text` with the special tokens tokenizer.json's own post-processor adds (a BOS for a Llama
    tokenizer with add_bos_token; nothing for SmolLM2's or GPT-2's byte-level one), as the runner's tokenizer
    adds them by default. Tokens it would append after the text are refused: they cannot belong to a context."""
    plain = tok.encode(text, add_special_tokens=False).ids
    full = tok.encode(text, add_special_tokens=True).ids
    if full[len(full) - len(plain):] != plain:
        raise Unreadable(f"the tokenizer adds special tokens after a text (with them {full}, without {plain}); a "
                         "candidate boundary cannot be checked")
    return full


def retokenise(tok, prompt, r, w, bad):
    """Context and context+candidate tokenised together, as lm-eval's _encode_pair does: the context ids must be a
    prefix of the whole, the rest are the candidate's ids, starting where the context ends. Returns (context ids,
    [candidate ids])."""
    if prompt != prompt.rstrip():
        bad.append(f"{w} prompt: ends with whitespace; the candidate boundary would be ambiguous")
    ctx_ids = encode(tok, prompt)
    expect(bad, w, "context_tokens", r["context_tokens"], len(ctx_ids), "re-tokenised prompt")
    cand_ids = []
    for j, c in enumerate(r["candidates"]):
        whole = encode(tok, prompt + c["text"])
        if whole[:len(ctx_ids)] != ctx_ids:
            bad.append(f"{w} candidates[{j}]: context tokens are not a prefix of context+candidate tokens "
                       f"({c['text']!r})")
        expect(bad, w, f"candidates[{j}].token_ids", c["token_ids"], whole[len(ctx_ids):],
               "re-tokenised context+candidate minus the context")
        expect(bad, w, f"candidates[{j}].start", c["start"], len(ctx_ids))
        cand_ids.append(whole[len(ctx_ids):])
    return ctx_ids, cand_ids


def candidate_tokenisation_check(C, name, texts, records, prompt_of, ident, model_dir, key_of=lambda r: r["idx"],
                                 where_of=lambda r: f"idx {r['idx']}", check=TOKENISATION):
    """Row `check`: every record's candidates re-tokenised (retokenise) from its private prompt (`prompt_of(text
    row, record)`, None when the text has none). Returns {key_of(r): (context ids, [candidate ids])} for the
    forward level, or None when anything failed or could not run (the forward level must not score token lists
    this level rejected)."""
    if texts is None:
        C.skip(name, IDENTITY, check,
               "needs the private texts (absent); candidate token ids and boundaries NOT checked")
        return None
    bad = []
    tok = tokenizer_or_skip(C, name, check, model_dir, ident, bad)
    if tok is None:
        return None
    result = {}
    for r in records:
        t = texts.get(r["idx"])
        prompt = prompt_of(t, r) if t is not None else None
        if prompt is None:
            bad.append(f"{where_of(r)} prompt: no private text for this record; cannot re-tokenise it")
            continue
        result[key_of(r)] = retokenise(tok, prompt, r, where_of(r), bad)
    C.add(name, IDENTITY, check, len(records), bad,
          note=f"tokenizers.Tokenizer from {model_dir / 'tokenizer.json'}, with the special tokens its own "
               "post-processor prepends")
    return None if bad else result


def multiple_choice_identity(C, name, records, ident, model_dir, texts_check, data_check):
    """The identity level of a multiple-choice experiment scored on both paths (protocol, MC-TACO), in row order:
    the experiment's private texts row (`texts_check()` -> texts by idx, or None when absent), the shared
    tokenisation row (each text's "prompt" re-tokenised), the experiment's data parquet row (`data_check()`).
    Returns the verified token ids for the forward level, or None."""
    if records is None:
        for check in ("private texts", "tokenisation", "data parquet"):
            C.skip(name, IDENTITY, check, "the arithmetic level found records.jsonl or config.json unusable")
        return None
    texts = texts_check()
    tokens = candidate_tokenisation_check(C, name, texts, records, lambda t, r: t["prompt"], ident, model_dir)
    data_check()
    return tokens


def chat_template(model_dir):
    """The model's chat template as transformers reads it (tokenizer_config.json's chat_template, else
    chat_template.jinja), or None."""
    template = None
    if model_dir and (model_dir / "tokenizer_config.json").exists():
        template = read_json(model_dir / "tokenizer_config.json").get("chat_template")
    if template is None and model_dir and (model_dir / "chat_template.jinja").exists():
        template = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    return template if isinstance(template, str) else None


def sst2_rows(parquet):
    """{idx: (label, sentence)} of an SST-2-shaped parquet (columns idx, label, sentence)."""
    import pyarrow.parquet as pq
    cols = pq.read_table(parquet).to_pydict()
    if not {"idx", "label", "sentence"} <= set(cols):
        raise Unreadable(f"{parquet}: columns {sorted(cols)}, expected idx, label, sentence")
    return {int(i): (int(l), s) for i, l, s in zip(cols["idx"], cols["label"], cols["sentence"])}


def sst2_data_check(C, name, cfg, records, parquet, check, where_of=lambda r: f"idx {r['idx']}"):
    """Row `check`: config.json's n_rows and canonical content hash recomputed from the data parquet, and each
    record's label and sentence hash found in it."""
    if parquet is None or not parquet.exists():
        C.skip(name, IDENTITY, check, f"data parquet not found ({parquet}); labels NOT checked against the data")
        return
    try:
        rows = sst2_rows(parquet)
    except ImportError as e:
        C.skip(name, IDENTITY, check, f"cannot import pyarrow ({e})")
        return
    bad = []
    expect(bad, "config.json", "n_rows", cfg.get("n_rows", MISSING), len(rows), f"rows in {parquet}")
    content = "".join(f"{i}\t{rows[i][0]}\t{rows[i][1]}\n" for i in sorted(rows))
    expect(bad, "config.json", "data_content_sha256", cfg.get("data_content_sha256", MISSING), sha256_text(content),
           f"canonical content hash of {parquet}")
    for r in records:
        w = where_of(r)
        if r["idx"] not in rows:
            bad.append(f"{w} idx: not in the data")
            continue
        expect(bad, w, "label", r["label"], rows[r["idx"]][0], "label in the data")
        expect(bad, w, "sentence_sha256", r["sentence_sha256"], sha256_text(rows[r["idx"]][1]), "sentence in the data")
    C.add(name, IDENTITY, check, len(records), bad, note=str(parquet))
