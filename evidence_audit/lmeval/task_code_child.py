"""The sandboxed side of task_code.py. Never imported: task_code.py sends this file's text to harness/sandbox.py,
which runs it confined (bubblewrap, else its own jail: no network, no host file but the Python installation, the
audit's site-packages and /usr/lib read-only; threads but no new process; CPU, memory, time and output bounded) and
calls f(job) once. The task's own code runs here, in the same interpreter, so nothing this file returns is trusted:
the parent reads the one result line with the audit's strict reader and checks its shape.

job = {"modules":   [{"name": "utils", "path": "<the file as the audit found it>", "text": "<its text>"}, ...],
       "functions": {field: [index into modules, the source lm-eval logged for it]},
       "splits":    {"eval" | "fewshot": {"format": "jsonl" | "parquet", "data": "<text, or base64 for parquet>",
                                          "ids": [the document ids wanted] or None for all,
                                          "results": [[doc_id, [filtered response, ...]], ...] (eval, with
                                                      process_results: one per logged sample)}}}

Each module is executed as lm-eval's `!function` loader executes a task's Python file (a module named after the file,
not entered in sys.modules); each field's function is the module's function whose inspect.getsource is the logged
source, exactly (lm-eval logs a function-valued config field as inspect.getsource of it). A split is built from the
--data file's bytes as the datasets library's json / parquet builders read a file whose rows share one schema
(pyarrow's JSON reader over the whole file; pyarrow's parquet reader) into a datasets.Dataset; process_docs, when the
task has one, is applied to the whole split, and its documents are listed in order: document k is doc_id k. The
doc_to_text / doc_to_target / doc_to_choice functions run on those documents, and process_results on (document at
doc_id, the sample's filtered responses), a loglikelihood response as the tuple (log-likelihood, is_greedy) lm-eval
hands it.

f(job) returns one JSON text (lm-eval's rule for what JSON cannot hold: a numpy integer as an int, a set as a list,
anything else as its str):
    {"versions": {"python": ..., "datasets": ..., "pyarrow": ...},
     "splits": {name: {"n": count of documents, "ids": [...], "docs": [...], "values": {field: [...]},
                       "errors": {field: {"<position>": "<exception>"}}, "metrics": [one dict per result]}}}
or {"error": "<what it was doing>: <exception>"}. An import of lm_eval by the task's code is refused (ImportError):
the audit runs the task's file, not lm-eval."""
import base64
import inspect
import io
import json
import linecache
import os
import sys
import types

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                    "RAYON_NUM_THREADS")     # numerical libraries start one thread per CPU at import without them
DOC_FIELDS = ("doc_to_text", "doc_to_target", "doc_to_choice")
MAX_MESSAGE = 300


class Refuse:
    """A meta path finder that refuses lm_eval: the task's code runs, lm-eval's does not."""

    def find_spec(self, name, path=None, target=None):
        if name == "lm_eval" or name.startswith("lm_eval."):
            raise ImportError(f"the task's code imports {name}: lm-eval's own code is not run by the audit")
        return None


def as_logged(value):
    """What lm-eval's tracker writes for a value JSON has no form for: a numpy int64/int32 as an int, a set as a
    list, anything else as str(value)."""
    import numpy

    if isinstance(value, (numpy.int64, numpy.int32)):
        return int(value)
    if isinstance(value, set):
        return list(value)
    return str(value)


def load_module(spec):
    """A task file executed as a module named after it; its text is put in linecache so inspect.getsource reads
    the lines that ran."""
    module = types.ModuleType(spec["name"])
    module.__file__ = spec["path"]
    lines = spec["text"].splitlines(keepends=True)
    linecache.cache[spec["path"]] = (len(spec["text"]), None, lines, spec["path"])
    exec(compile(spec["text"], spec["path"], "exec"), module.__dict__)
    return module


def function_of(module, source, field):
    """The function of `module` whose source is `source`: ValueError when none is."""
    for value in list(vars(module).values()):
        if inspect.isfunction(value):
            try:
                if inspect.getsource(value) == source:
                    return value
            except (OSError, TypeError):
                continue
    raise ValueError(f"no function of {module.__file__} has the source lm-eval logged for {field}")


def dataset_of(split):
    """The datasets.Dataset of one split's file."""
    import datasets
    import pyarrow.json
    import pyarrow.parquet
    from datasets.table import InMemoryTable

    if split["format"] == "jsonl":
        raw = split["data"].encode("utf-8")
        table = pyarrow.json.read_json(io.BytesIO(raw),
                                       read_options=pyarrow.json.ReadOptions(block_size=max(len(raw), 1 << 16)))
    else:
        table = pyarrow.parquet.read_table(io.BytesIO(base64.b64decode(split["data"])))
    return datasets.Dataset(InMemoryTable(table))


SEEDS = (1234, 4321)      # two seeds of the global random state (Python's, numpy's) process_docs is run under


def seeded(seed):
    import random
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed)
    except ImportError:
        pass


def documents(split, functions, stage):
    """One split's documents (process_docs applied) and the doc_to_* values of the wanted ones."""
    stage[0] = "reading the split's data"
    docs, varies = dataset_of(split), None
    if "process_docs" in functions:
        stage[0] = "process_docs"
        seeded(SEEDS[0])
        docs = list(functions["process_docs"](docs))
        # a process_docs that draws from the global random state (gpqa shuffles its choices) gives what lm-eval's
        # seed and every draw before it made: run again under another seed, and say where the two differ
        stage[0] = "process_docs under another seed"
        seeded(SEEDS[1])
        again = list(functions["process_docs"](dataset_of(split)))
        varies = next((i for i, (a, b) in enumerate(zip(docs, again)) if a != b),
                      None if len(docs) == len(again) else min(len(docs), len(again)))
    stage[0] = "listing the documents"
    docs = list(docs)
    ids = split["ids"] if split["ids"] is not None else list(range(len(docs)))
    wanted = [docs[i] for i in ids if 0 <= i < len(docs)]
    values, errors = {}, {}
    for field in DOC_FIELDS:
        if field not in functions:
            continue
        stage[0] = field
        values[field], errors[field] = [], {}
        for k, doc in enumerate(wanted):
            try:
                values[field].append(functions[field](doc))
            except Exception as e:      # lm-eval would have stopped on it: a finding about that document
                values[field].append(None)
                errors[field][str(k)] = f"{type(e).__name__}: {str(e)[:MAX_MESSAGE]}"
    out = {"n": len(docs), "ids": [i for i in ids if 0 <= i < len(docs)], "docs": wanted, "values": values,
           "errors": errors, "varies": varies}
    if "process_results" in functions and split.get("results") is not None:
        stage[0] = "process_results"
        out["metrics"], errors["process_results"] = [], {}
        for k, (i, results) in enumerate(split["results"]):
            try:
                if not 0 <= i < len(docs):
                    raise IndexError(f"no document {i} among {len(docs)}")
                got = functions["process_results"](docs[i], [tuple(r) if isinstance(r, list) else r for r in results])
                out["metrics"].append(dict(got))
            except Exception as e:      # as for the doc_to_* functions: a reason, not a finding
                out["metrics"].append(None)
                errors["process_results"][str(k)] = f"{type(e).__name__}: {str(e)[:MAX_MESSAGE]}"
    return out


def run(job, stage):
    for name in THREAD_VARIABLES:
        os.environ[name] = "1"
    os.environ["HOME"] = os.getcwd()    # the sandbox's one writable directory (nltk wants a home at import)
    sys.meta_path.insert(0, Refuse())
    stage[0] = "importing datasets"
    import datasets
    import pyarrow

    datasets.disable_progress_bars()
    modules = []
    for spec in job["modules"]:
        stage[0] = f"executing {spec['path']}"
        modules.append(load_module(spec))
    functions = {}
    for field, (index, source) in job["functions"].items():
        stage[0] = f"finding {field} in {job['modules'][index]['path']}"
        functions[field] = function_of(modules[index], source, field)
    splits = {name: documents(split, functions, stage) for name, split in job["splits"].items()}
    return {"versions": {"python": sys.version.split()[0], "datasets": datasets.__version__,
                         "pyarrow": pyarrow.__version__}, "splits": splits}


def f(job):
    """The one call the sandbox makes: the job's result as JSON text, or what failed."""
    stage = ["starting"]
    try:
        result = run(job, stage)
        stage[0] = "writing the result as JSON"
        return json.dumps(result, ensure_ascii=False, allow_nan=False, default=as_logged)
    except BaseException as e:      # noqa: BLE001 (the task's code may raise anything, SystemExit included)
        return json.dumps({"error": f"{stage[0]}: {type(e).__name__}: {str(e)[:MAX_MESSAGE]}"})
