"""Audit one evidence directory: find its experiments, run each one's rule, collect the report dict; and what the
run must have written (its experiments, their private halves, no public file without a rule, no private text in the
public part, the per-rank facts), derived from the evidence and run.py's rules, never from MANIFEST.json."""
import hashlib
import json
import re
from pathlib import Path

import registry
from evidence_audit import sampling
from evidence_audit.checks import ARITHMETIC, AUDIT_FORMAT, FORWARD, Checks, headline, short
from evidence_audit.definitions import is_int, is_num
from evidence_audit.manifest import is_audit_output, is_run_id, manifest_check, walk
from evidence_audit.reading import (PATHS_FILE, Unreadable, check_formats, evidence_object, paths_problems, read_json,
                                    sha256_file)
from evidence_audit.report_page import page_rebuild_check, report_html_check
from evidence_audit.rules import RULES
from evidence_audit.run_command import experiments_of_command
from evidence_audit.signature import SIGNATURE


def audit(out, levels=(ARITHMETIC,), cache=None, only=None, public_only=False, options=None, allowed_signers=None,
          rebuild_page=True, page_memo=None):
    """Audit every experiment directory under `out` (or those named in `only`; the rest are reported as SKIPPED):
    the manifest level first (MANIFEST.json against the files), then each experiment's rule, then report.html,
    then what O must hold whatever the manifest says (completeness_checks; O/private/ absent while experiments are
    present makes the headline INCOMPLETE, whatever MANIFEST.json's "private" lists).
    `public_only`: the reader holds published evidence without O/private/ and says so (see headline).
    `options`: checks.AuditOptions (--threads, --review), handed to the rules as C.options.
    `allowed_signers`: --allowed-signers FILE (signature.check_allowed_signers'd): verify O/MANIFEST.json.sig.
    `rebuild_page` False / `page_memo` (a dict): for the mutation self-test only, which ignores the page's rows in
    one audit and audits one unchanged copy at several levels (report_page.page_rebuild_check).
    Returns the report dict; raises Unreadable (exit 2)."""
    out = Path(out)
    if out.is_symlink():
        raise Unreadable(f"{out}: a symlink; audit the evidence directory itself, not a link to it")
    if not out.is_dir():
        near = evidence_beside(out) if not out.exists() else None
        if near:            # a typo of a run's directory: not a reason to make another run
            raise Unreadable(f"{out}: no such evidence directory; did you mean {near} (it holds a run's MANIFEST.json)?")
        raise Unreadable(f"{out}: no such evidence directory; run: python run.py --cache CACHE --out {out}")
    lm_eval_output = lm_eval_output_hint(out)
    if lm_eval_output:
        raise Unreadable(lm_eval_output)
    fmt = check_formats(out)    # evidence of a format the rules were not written for is refused before any row
    C = Checks(options)
    sealed = manifest_check(C, out, public_only, allowed_signers)
    experiments = sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")
                         and p.name != "private")
    if not experiments:
        C.add("-", ARITHMETIC, "experiment directories", 0, [f"{out}: no experiment directory to audit"])
    if not (out / "environment.json").exists():
        C.add("-", ARITHMETIC, "required files", 1, [f"{out}/environment.json: missing"])
    info = {}
    for name in experiments:
        if only and name not in only:
            C.skip(name, "-", "(whole experiment)", "not selected (--experiment)", requested=False)
        elif name not in RULES:
            C.add(name, ARITHMETIC, "audit rule", 0, [f"{name}/: no audit rule for this experiment; its claims are NOT "
                                                      "verified (write one in evidence_audit/rules/ and declare "
                                                      "the experiment in registry.py)"])
        else:
            info[name] = RULES[name](C, name, out, levels, cache)
    limited = sorted({r["experiment"] for r in C.rows if r["note"].startswith("LIMITED RUN")})
    if limited:             # a quick look, not a result: said where a reader looks first
        C.headline_note(f"limited run (--limit): {', '.join(limited)}")
    report_html_check(C, out, sealed["run_id"], sealed["manifest"])
    if not only and rebuild_page:   # built from public evidence: every audit, --public-only too, rebuilds the page
        page_rebuild_check(C, out, memo=page_memo)
    stray_evidence(C, out, experiments, only)
    completeness_checks(C, out, experiments, fmt)
    if not (out / "private").exists():      # what the experiments present write, not only what the manifest lists
        sealed["private_absent"] = sorted(set(sealed["private_absent"]) | set(experiments))
    if public_only and sealed["private_absent"]:      # the reader said so: a check needing O/private/ was not asked
        for r in C.rows:
            if r["status"] == "SKIPPED" and "private" in r["note"]:
                r["requested"] = False
    status = [r["status"] for r in C.rows]
    skipped_requested = [r for r in C.rows if r["status"] == "SKIPPED" and r.get("requested", True)]
    report = {"audit_format": AUDIT_FORMAT, "evidence": str(out), "levels": list(levels),
              "cache": str(cache) if cache else None, "experiments": experiments, "checks": C.rows,
              "n_pass": status.count("PASS"), "n_fail": status.count("FAIL"), "n_skipped": status.count("SKIPPED"),
              "n_skipped_requested": len(skipped_requested), "details": info, "run_id": sealed["run_id"],
              "public_only": public_only, "private_absent": sealed["private_absent"], "signature": sealed["signature"],
              "exit_code": 1 if "FAIL" in status else 0}
    headline(report)
    if C.headline_notes:      # on the RESULT line, where a reader looks first
        report["headline_note"] = "; ".join(C.headline_notes)
    report["sample"] = sampling.report_entry(C.options.sample, FORWARD in levels)
    return report


def evidence_beside(out, most=1000):
    """The closest-named directory beside `out` that holds a MANIFEST.json (`smok` for `smoke`), or None; at most
    `most` entries of the parent are looked at."""
    import difflib

    parent = out.parent if str(out.parent) else Path(".")
    try:
        names = [p.name for _, p in zip(range(most), parent.iterdir()) if (p / "MANIFEST.json").is_file()]
    except OSError:
        return None
    close = difflib.get_close_matches(out.name, names, n=1, cutoff=0.6)
    return parent / close[0] if close else None


def lm_eval_output_hint(out, most=1000):
    """The line for an lm-eval output directory given without --lm-eval (results_*.json in it or in a model
    subdirectory one level down, and no MANIFEST.json), or None. At most `most` entries are looked at."""
    if (out / "MANIFEST.json").exists():
        return None
    seen = 0
    for entry in out.iterdir():
        seen += 1
        if seen > most:
            return None
        if entry.is_file() and entry.name.startswith("results_") and entry.suffix == ".json":
            found = entry
        elif entry.is_dir() and not entry.is_symlink() and entry.name != "private":
            found = next((p for _, p in zip(range(most), entry.iterdir())
                          if p.name.startswith("results_") and p.suffix == ".json"), None)
        else:
            found = None
        if found is not None:
            return (f"{out}: lm-eval output ({found.relative_to(out)}), not run.py evidence: audit it with "
                    f"python audit.py --lm-eval {out}")
    return None


def stray_evidence(C, out, experiments, only):
    """Failed rows for what no rule covers: an --experiment with no directory, private files with no public
    evidence, and a run.py FAILED.json (a failed run installs no evidence, but says so)."""
    selected = lambda name: not only or name in only      # noqa: E731
    for name in only or []:
        if name not in experiments:
            C.add(name, ARITHMETIC, "experiment directory", 0, [f"{out}/{name}: no such experiment directory"])
    private = sorted(p.name for p in (out / "private").iterdir() if p.is_dir()) if (out / "private").is_dir() else []
    for name in private:
        if name not in experiments and selected(name):
            C.add(name, ARITHMETIC, "private evidence", 0,
                  [f"private/{name}/: private files for an experiment with no public evidence"])
    for failed in sorted(out.glob("*.FAILED.json")):
        name = failed.name[:-len(".FAILED.json")]
        if selected(name):
            C.add(name, ARITHMETIC, "run outcome", 0,
                  [f"{failed.name}: run.py recorded a failed run of this experiment (see that file)"])


# ---- what the run must have written, derived from the evidence, never from MANIFEST.json ------------------------
# A forger who deletes an experiment (or O/private, or adds a file) and reseals MANIFEST.json passes the manifest
# level by construction; these rows rest on what run.py writes, written again here, and on the command line that
# environment.json records. Only the evidence digest cited beside the commit ties O to the run that made it: a
# forger who also rewrites the recorded command line makes O consistent again.

# the public files of O/<experiment>/ (run.py's write_evidence: the five of every experiment, plus the extras an
# experiment's Result.public names) and the top-level files of O; anything else in the public part has no rule
PUBLIC_FILES = ("config.json", "identity.json", "records.jsonl", "summary.json", "stages.json")
PUBLIC_EXTRAS = {e.name: e.public_extras for e in registry.EXPERIMENTS}        # declared in registry.py
TOP_FILES = ("MANIFEST.json", "environment.json", "report.html", "run.log", SIGNATURE)
TOP_OF_EXPERIMENT = {e.name: e.top_files for e in registry.EXPERIMENTS}    # written into O before the model loads
# the private files every experiment run.py installs (run.json ties the private half to the public one by the run id),
# and the text file each experiment's Result.private names
PRIVATE_FILES = {e.name: e.private_files for e in registry.EXPERIMENTS}
MIN_TEXT = 20           # shorter private strings (an answer, a label) may appear in public files legitimately
MAX_SCAN_BYTES = 256 * 1024 * 1024      # the private-text scan reads at most this much of the public part


def ran_check(C, out, experiments):
    """Row "experiments the recorded command ran": every experiment environment.json's command_line ran has its
    directory or its FAILED.json, and no other experiment is in O."""
    check = "experiments the recorded command ran (environment.json command_line, not MANIFEST.json)"
    env = read_json(out / "environment.json") if (out / "environment.json").is_file() else None
    failed = sorted(p.name[:-len(".FAILED.json")] for p in out.glob("*.FAILED.json"))
    if not isinstance(env, dict):
        C.add("-", ARITHMETIC, check, 0, ["environment.json: missing or not an object; it records the command that "
                                          "ran, the only record of which experiments O must hold"])
        return
    if "command_line" not in env:
        # not FAIL: deleting the line gives a forger no more than rewriting it would (only the cited evidence digest
        # ties O to its run), and evidence made by hand for the tests has none
        C.skip("-", ARITHMETIC, check, "environment.json records no command_line (run.py records sys.argv there): "
               "which experiments O must hold is NOT checked", requested=False)
        return
    ran, why_not = experiments_of_command(env["command_line"])
    if ran is None and why_not.startswith("a --merge"):
        bad = [f"{n}/: not an experiment registry.py declares" for n in experiments if n not in registry.NAMES]
        C.add("-", ARITHMETIC, check, len(experiments), bad, note=why_not)
        return
    if ran is None:
        C.add("-", ARITHMETIC, check, 0, [why_not])
        return
    bad = [f"{n}/: the recorded command ran {n}, but O holds neither {n}/ nor {n}.FAILED.json (deleted after the "
           "run, or the run stopped before installing it)" for n in ran if n not in experiments and n not in failed]
    bad += [f"{n}/: the recorded command did not run {n} (command line: {short(' '.join(env['command_line']), 100)})"
            for n in sorted(set(experiments) | set(failed)) if n not in ran]
    C.add("-", ARITHMETIC, check, len(ran), bad, note="run: " + ", ".join(ran))


def expected_private(experiments, fmt=None):
    """{experiment: [paths under O/private/<experiment>/ it must hold]}: run.json for every experiment, paths.json
    too from evidence format 3 on (the local paths the public files name by placeholder), and the text file each
    known experiment writes."""
    own = ["run.json"] + ([PATHS_FILE] if fmt is not None and fmt >= 3 else [])
    return {n: [*own, *PRIVATE_FILES.get(n, ())] for n in experiments}


def private_presence_check(C, out, experiments, fmt=None):
    """Row "private evidence each experiment writes": with O/private/ present, every experiment present has its
    private files (what run.py writes, not what MANIFEST.json lists). O/private/ absent is the headline's
    INCOMPLETE (see headline)."""
    check = "private evidence each experiment writes (not what MANIFEST.json lists)"
    want = expected_private(experiments, fmt)
    if not (out / "private").is_dir():
        C.skip("-", ARITHMETIC, check, "O/private/ absent", requested=False)
        return
    bad = [f"private/{n}/{rel}: missing (run.py writes it for every {n} run)" for n, rels in want.items()
           for rel in rels if not (out / "private" / n / rel).is_file()]
    C.add("-", ARITHMETIC, check, sum(map(len, want.values())), bad)


def public_rule_problems(out, experiments):
    """Every file of the public part of O is one run.py writes for the experiments present (or an audit output),
    every directory an experiment's."""
    allowed = set(TOP_FILES)
    allowed |= {f"{n}.FAILED.json" for n in registry.NAMES}
    failed = [p.name[:-len(".FAILED.json")] for p in out.glob("*.FAILED.json")]
    for n in experiments:
        allowed |= {f"{n}/{f}" for f in PUBLIC_FILES + PUBLIC_EXTRAS.get(n, ())}
    for n in [*experiments, *failed]:      # a pre-registration is written before the model loads, so before a failure
        allowed |= set(TOP_OF_EXPERIMENT.get(n, ()))
    files, dirs, _ = walk(out)
    public = [f for f in files if not f.startswith("private/")]
    bad = [f"{rel}: a public file no rule knows (run.py writes {', '.join(PUBLIC_FILES)} per experiment, "
           f"and {', '.join(TOP_FILES)} in O)" for rel in public if rel not in allowed and not is_audit_output(rel)]
    bad += [f"{d}/: a directory that is not an experiment's" for d in dirs
            if d != "private" and not d.startswith("private/") and d not in experiments]
    return bad, len(public)


def public_rule_check(C, out, experiments):
    bad, n = public_rule_problems(out, experiments)
    C.add("-", ARITHMETIC, "public files run.py writes (a rule for each, not what MANIFEST.json lists)", n, bad)


def private_texts(root):
    """({sha256: private path}, {string: private path}): every private file's hash, and every string of at least
    MIN_TEXT characters in the private JSON/JSONL files (texts, prompts, generations, task files). Lines that are
    not JSON (a task file's comments) are passed over: the manifest level, not this row, vouches for these files."""
    hashes, strings, budget = {}, {}, MAX_SCAN_BYTES
    files, _, _ = walk(root)
    for rel in files:
        p = root / rel
        hashes[sha256_file(p, cached=False)] = f"private/{rel}"
        if not rel.endswith((".jsonl", ".json")) or p.stat().st_size > budget:
            continue
        data = p.read_bytes()
        budget -= len(data)
        lines = data.decode("utf-8", errors="replace").splitlines() if rel.endswith(".jsonl") else [data]
        for s in (s for line in lines for s in strings_in(lenient_json(line))):
            strings.setdefault(s, f"private/{rel}")
    return hashes, strings


def lenient_json(text):
    """The parsed value of `text`, or None when it is not JSON (or nested past Python's recursion limit)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def strings_in(obj, inside=False):
    """Every string of at least MIN_TEXT characters held under one of TEXT_KEYS in a parsed JSON value (at any
    depth), iteratively. Outputs (generations, predictions) and settings (a model name) are left out: a short
    generation may equal a public example of the answer format, and is no text of the data."""
    stack, found = [(obj, inside)], []
    while stack:
        v, text = stack.pop()
        if isinstance(v, str):
            if text and len(v) >= MIN_TEXT and not SHA_LIKE.fullmatch(v):
                found.append(v)
        elif isinstance(v, dict):
            stack.extend((x, text or k in TEXT_KEYS) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, text) for x in v)
    return found


# the private fields that hold the data's texts and the prompts built from them (texts.jsonl, generations.jsonl,
# a harness task file)
TEXT_KEYS = ("sentence", "prompt", "prompts", "question", "answer", "user_message")
SHA_LIKE = re.compile(r"[0-9a-f]{32,64}")       # hashes and run ids are shared by both halves on purpose


def private_leak_check(C, out):
    """Row "no private text in the public part": no public file is a copy of a private file, and none holds a
    private string (raw or JSON-escaped). Needs O/private/."""
    check = "no private text in the public part (file hashes and strings of O/private/)"
    if not (out / "private").is_dir():
        C.skip("-", ARITHMETIC, check, "O/private/ absent: nothing to compare the public files with",
               requested=False)
        return
    hashes, strings = private_texts(out / "private")
    anchors = {}        # a needle's first MIN_TEXT characters -> [(needle, private file)]: one pass per public file
    for s, where in strings.items():
        for needle in dict.fromkeys((s, json.dumps(s, ensure_ascii=True)[1:-1])):
            anchors.setdefault(needle[:MIN_TEXT], []).append((needle, where))
    files, _, _ = walk(out)
    public = [f for f in files if not f.startswith("private/")]
    bad, budget = [], MAX_SCAN_BYTES
    for rel in public:
        data = (out / rel).read_bytes() if (out / rel).stat().st_size <= budget else None
        if data is None:
            bad.append(f"{rel}: not scanned (the public part exceeds {MAX_SCAN_BYTES} bytes)")
            continue
        budget -= len(data)
        digest = hashlib.sha256(data).hexdigest()
        if digest in hashes:
            bad.append(f"{rel}: a copy of {hashes[digest]} (private texts are never published)")
            continue
        hit = first_needle(data.decode("utf-8", errors="replace"), anchors)
        if hit:
            bad.append(f"{rel}: holds a text of {hit} (private texts are never published)")
    C.add("-", ARITHMETIC, check, len(public), bad, note=f"{len(strings)} private strings, {len(hashes)} files")


DP_MODES = {"distributed": ("rank", "host", "pid", "wall_s", "peak_rss_bytes"),
            "replay": ("shard", "run_id", "host", "cpu", "peak_rss_bytes", "git_commit", "git_dirty", "kernels")}
# a merge written before each shard's commit and kernels were recorded (launch.with_rank_environment)
DP_REPLAY_BEFORE = ("shard", "run_id", "host", "cpu", "peak_rss_bytes")


def rank_problems(k, mode, r):
    """One entry of environment.json data_parallel.ranks (launch.with_rank_environment, written again): its fields,
    its place (rank k, or shard k + 1), a non-negative wall time and peak RSS."""
    where = f"environment.json data_parallel.ranks[{k}]"
    if not isinstance(r, dict) or (set(r) != set(DP_MODES[mode]) and not (mode == "replay"
                                                                         and set(r) == set(DP_REPLAY_BEFORE))):
        return [f"{where}: expected the fields {', '.join(DP_MODES[mode])}, found {short(r, 80)}"]
    bad = []
    if "git_commit" in r and not (r["git_commit"] is None or (isinstance(r["git_commit"], str)
                                                              and re.fullmatch(r"[0-9a-f]{7,64}", r["git_commit"]))):
        bad.append(f"{where} git_commit: {short(r['git_commit'])} is not a git commit")
    if "git_dirty" in r and r["git_dirty"] not in (True, False, None):
        bad.append(f"{where} git_dirty: {short(r['git_dirty'])} is not true, false or null")
    if "kernels" in r and not (isinstance(r["kernels"], str) and len(r["kernels"]) <= 2000):
        bad.append(f"{where} kernels: {short(r['kernels'])} is not a kernel summary line")
    place, want = ("rank", k) if mode == "distributed" else ("shard", k + 1)
    if not (is_int(r[place]) and r[place] == want):
        bad.append(f"{where} {place}: {short(r[place])}, expected {want}")
    if "wall_s" in r and not (is_num(r["wall_s"]) and r["wall_s"] >= 0):
        bad.append(f"{where} wall_s: {short(r['wall_s'])} is not a non-negative number of seconds")
    rss = r["peak_rss_bytes"]
    if not ((is_int(rss) and rss >= 0) or (rss is None and mode == "replay")):
        bad.append(f"{where} peak_rss_bytes: {short(rss)} is not a non-negative integer")
    if "run_id" in r and not is_run_id(r["run_id"]):
        bad.append(f"{where} run_id: {short(r['run_id'])} is not a run id")
    return bad


def environment_ranks_problems(out, env, experiments):
    """environment.json "data_parallel" (absent in one process): a known mode, world_size >= 2 with one valid
    entry per rank, and the world size every experiment's stages.json data_parallel states."""
    dp = env.get("data_parallel")
    if dp is None:
        bad = []
        world = None
    elif not (isinstance(dp, dict) and dp.get("mode") in DP_MODES):
        return [f"environment.json data_parallel: {short(dp, 80)} is not a distributed run's or a merge's"]
    else:
        world, ranks = dp.get("world_size"), dp.get("ranks")
        if not (is_int(world) and world >= 2 and isinstance(ranks, list) and len(ranks) == world):
            return [f"environment.json data_parallel: expected world_size >= 2 and one entry per rank, found "
                    f"{short(world)} and {short(ranks, 80)}"]
        bad = [f for k, r in enumerate(ranks) for f in rank_problems(k, dp["mode"], r)]
    for name in experiments:
        stages = read_json(out / name / "stages.json") if (out / name / "stages.json").is_file() else None
        sdp = stages.get("data_parallel") if isinstance(stages, dict) else None
        got = sdp.get("world_size") if isinstance(sdp, dict) else None
        if got != world:
            bad.append(f"{name}/stages.json data_parallel world_size: {short(got)}, environment.json says "
                       f"{short(world)}")
    return bad


def first_needle(text, anchors):
    """The private file of the first needle found in `text` (anchors: see private_leak_check), or None."""
    for i in range(len(text) - MIN_TEXT + 1):
        for needle, where in anchors.get(text[i:i + MIN_TEXT], ()):
            if text.startswith(needle, i):
                return where
    return None


def environment_ranks_check(C, out, experiments):
    env = read_json(out / "environment.json") if (out / "environment.json").is_file() else None
    if not isinstance(env, dict):
        C.skip("-", ARITHMETIC, "environment.json data_parallel (ranks, wall time, peak RSS)",
               "environment.json missing (named under 'required files')", requested=False)
        return
    C.add("-", ARITHMETIC, "environment.json data_parallel (ranks, wall time, peak RSS)", len(experiments) + 1,
          environment_ranks_problems(out, env, experiments))


def completeness_checks(C, out, experiments, fmt=None):
    """Every row that says what O must hold, without MANIFEST.json. `fmt`: O's evidence format."""
    ran_check(C, out, experiments)
    private_presence_check(C, out, experiments, fmt)
    public_rule_check(C, out, experiments)
    private_leak_check(C, out)
    local_paths_check(C, out, experiments, fmt)
    environment_ranks_check(C, out, experiments)


LOCAL_PATHS = "no local path in the public part (the paths O/private/<exp>/paths.json names)"
NAME_CHARS = rb"A-Za-z0-9._~+-"     # a path followed by one of these is another name ("/tmp" is not in "/tmpx")
# base64 that no reader reads as text (the page's PNG data URIs, the armored signature): "/tmp/" may occur in it by
# chance, so it is left out of the search
BASE64_SPANS = re.compile(rb"data:[a-z]+/[a-z0-9.+-]+;base64,[A-Za-z0-9+/=]+"
                          rb"|-----BEGIN [A-Z ]+-----[A-Za-z0-9+/=\s]+-----END [A-Z ]+-----")


def local_paths_check(C, out, experiments, fmt):
    """Row LOCAL_PATHS: from evidence format 3 on the public files name local paths by placeholder, so no public
    file (audit outputs aside: audit.py's, not the run's) may hold one of the paths the experiments'
    O/private/<exp>/paths.json name (in its bytes, the path not followed by a character that continues a file
    name; base64 images and signatures left out); each paths.json must be well formed and name its experiment. Needs O/private/; format 2 evidence records
    the paths in its public files by design."""
    if fmt is not None and fmt < 3:
        C.skip("-", ARITHMETIC, LOCAL_PATHS, f"evidence format {fmt} records local paths in its public files by "
               "design (config.json, identity.json, environment.json, run.log, report.html); format 3 names them "
               "by placeholder", requested=False)
        return
    if not (out / "private").is_dir():
        C.skip("-", ARITHMETIC, LOCAL_PATHS, "O/private/ absent: the paths to look for are named there",
               requested=False)
        return
    bad, roots = [], {}
    for name in experiments:
        path = out / "private" / name / PATHS_FILE
        if not path.is_file() or path.is_symlink():
            continue                    # named by the private presence row
        doc = evidence_object(path, read_json(path))
        problems = paths_problems(f"private/{name}/{PATHS_FILE}", doc)
        if not problems and doc["experiment"] != name:
            problems = [f"private/{name}/{PATHS_FILE} experiment: {short(doc['experiment'])}, expected {name!r}"]
        bad += problems
        if not problems:
            roots.update({p: placeholder for placeholder, p in doc["paths"].items() if p != "/"})
    needles = [(re.compile(re.escape(p.encode("utf-8")) + rb"(?![" + NAME_CHARS + rb"])"), p, placeholder)
               for p, placeholder in sorted(roots.items(), key=lambda kv: -len(kv[0]))]
    files, _, _ = walk(out)
    public = [f for f in files if not f.startswith("private/") and not is_audit_output(f)]
    budget = MAX_SCAN_BYTES
    for rel in public:
        size = (out / rel).stat().st_size
        if size > budget:
            bad.append(f"{rel}: not scanned (the public part exceeds {MAX_SCAN_BYTES} bytes)")
            continue
        budget -= size
        data = BASE64_SPANS.sub(b"", (out / rel).read_bytes())
        hit = next(((p, placeholder) for rx, p, placeholder in needles if rx.search(data)), None)
        if hit:
            bad.append(f"{rel}: holds the local path {hit[0]} (run.py writes it as {hit[1]}; the paths stay in "
                       "O/private/)")
    C.add("-", ARITHMETIC, LOCAL_PATHS, len(public), bad, note=f"{len(roots)} local path(s) looked for")
