"""Library chatter goes to O/run.log, the console keeps progress bars and results.

lm-eval, transformers, datasets and Python's warnings module print notices that are about their own defaults, not
about this run's results (a smoke run printed 14 "aggregation is not defined" warnings and 4 hints about an lm-eval
`--metadata` flag run.py does not have). They are routed through the logging module into O/run.log (appended, one
line per record, each write flushed), so nothing is lost and the console stays readable. tqdm progress bars are
not logging and stay on the console. `run.py --verbose` leaves everything on the console, as the libraries
configure it themselves.

Records are buffered in memory until the output directory exists (to_file), because run.py creates O only after
its inputs are verified: a refused command leaves no O behind.

run.log is a public file: every line is written with the run's local paths by their placeholders (to_file's
`scrub`, experiments/evidence.LocalPaths.text: a warning that names a file in the venv, the cache or O), which
O/private/<experiment>/paths.json maps back.
"""
import logging
import logging.handlers
import os
import re

# the loggers of the libraries that print on their own (their children propagate to them)
LIBRARY_LOGGERS = ("lm_eval", "transformers", "datasets", "huggingface_hub", "accelerate", "evaluate", "sklearn",
                   "urllib3", "filelock", "fsspec", "torch", "py.warnings")
LOG_FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"
ENDED = "run.py: run"           # the closing line: "run.py: run <run id> ended: <outcome>"
TAIL_BYTES = 1 << 16            # how much of an old run.log ending_of reads


def ending_of(path, run_id):
    """How run `run_id` ended, from the last closing line of run.log at `path` (log_end), or None: a run that was
    killed, or stopped before its run.log existed, wrote none."""
    if os.path.islink(path) or not os.path.isfile(path):     # never open a FIFO or follow a link
        return None
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    found = [m.group(1) for m in (re.search(rf"\[run\] {re.escape(ENDED)} {run_id} ended: (.*)$", line)
                                  for line in tail) if m]
    return found[-1] if found else None


class ScrubbingFormatter(logging.Formatter):
    """LOG_FORMAT, then `scrub` over the whole formatted record (its traceback too)."""

    def __init__(self, fmt, scrub=None):
        super().__init__(fmt)
        self.scrub = scrub

    def format(self, record):
        text = super().format(record)
        return self.scrub(text) if self.scrub is not None else text


class LibraryChatter:
    """Routes LIBRARY_LOGGERS and Python warnings into one handler: a memory buffer, then O/run.log."""

    def __init__(self, verbose=False):
        self.verbose = verbose
        self.buffer = logging.handlers.MemoryHandler(capacity=10 ** 6, flushLevel=logging.CRITICAL + 1)
        self.file = None

    def route(self):
        """Take the libraries' console handlers away and send their records (and warnings) to the buffer (with
        verbose: nothing is changed)."""
        if self.verbose:
            return
        import datasets  # noqa: F401  (imported first: it installs its own console handler on import)
        import transformers

        transformers.utils.logging.disable_default_handler()
        logging.captureWarnings(True)       # warnings.warn -> the "py.warnings" logger (filters unchanged)
        for name in LIBRARY_LOGGERS:
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.addHandler(self.buffer)
            logger.propagate = False
        # lm-eval calls logging.basicConfig-like setup only when the root logger has no handler; give it one so
        # that nothing it configures later writes to the console
        logging.getLogger().addHandler(self.buffer)

    def to_file(self, path, heading="run.py", scrub=None):
        """From now on (and for what was buffered so far) append to `path`, after a line naming the run (a reused
        output directory collects the messages of several runs). `scrub(text) -> text`: applied to every line
        written (the local paths by their placeholders)."""
        if self.verbose or self.file is not None or getattr(self, "closed", False):
            return
        self.file = logging.FileHandler(path, mode="a", encoding="utf-8")
        self.file.setFormatter(ScrubbingFormatter(LOG_FORMAT, scrub))
        self.file.handle(logging.makeLogRecord({"name": "run", "levelno": logging.INFO, "levelname": "INFO",
                                                "msg": f"{heading}: library messages of this run follow"}))
        self.buffer.setTarget(self.file)
        self.buffer.flushLevel = logging.NOTSET    # every record is written through at once
        self.buffer.flush()

    def log_end(self, run_id, outcome):
        """The closing line of this run in O/run.log: how it ended (a later run that sweeps this run's leftovers
        reads it: ending_of)."""
        if self.file is not None:
            self.file.handle(logging.makeLogRecord({"name": "run", "levelno": logging.INFO, "levelname": "INFO",
                                                    "msg": f"{ENDED} {run_id} ended: {outcome}"}))

    def close(self):
        """Flush and close O/run.log for good: run.py lists run.log in MANIFEST.json right after, so a record logged
        later (e.g. at interpreter exit) must not reopen and append to it; it stays in the memory buffer."""
        if self.file is not None:
            self.buffer.flush()
            self.buffer.setTarget(None)
            self.buffer.flushLevel = logging.CRITICAL + 1
            self.file.close()
            self.file = None
            self.closed = True
