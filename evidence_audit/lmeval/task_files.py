"""Which lm-eval release shipped a task's Python file: the sha256 of every lm_eval/tasks/**/*.py file of each lm-eval
wheel read (task_files.tsv beside this module, written by tools/make_task_file_table.py from the PyPI wheels; its
`# read` lines name the releases, each wheel's sha256 and its count of task files).

    identify(path)      -> (sha256 of the file, [(release, path under lm_eval/tasks/), ...])
    releases_of(sha256) -> [release, ...]

What a match proves: the file's bytes are the bytes that release's wheel shipped at that path. Not that a run used
them: lm-eval's output records no hash of its task code, so that tie is for the caller to make. Nor anything about
what the file imports from outside lm_eval/tasks/, nor about the YAML configs (only .py files are in the table).
An empty file (an empty __init__.py) matches every path that ships one. No match means no release read shipped
those bytes anywhere: an edited file, a git checkout between releases, a release not read (before 0.4.5, after
0.4.13, 0.4.6, which PyPI does not have), or a user's own task.

The table is read strictly (size cap, strict UTF-8, every line's shape, sorted, no duplicate, the per-release counts
of its `# read` lines): anything else is one line naming the table and the line (Unreadable, exit 2). A file given
to identify() is read bounded (MAX_FILE_BYTES, regular files only). Standard library only; nothing imports lm_eval.
"""
import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from evidence_audit.checks import cut
from evidence_audit.reading import Unreadable, read_bytes, read_text

TABLE = Path(__file__).with_name("task_files.tsv")
MAX_TABLE_BYTES = 8 << 20       # the table of ten releases is about 120 KB
MAX_FILE_BYTES = 4 << 20        # one task file (the largest any release read ships is under 90 KB)
MAX_PATH_CHARS = 400

TITLE = ("# sha256 of every lm_eval/tasks/**/*.py file of the lm-eval wheels read; "
         "written by tools/make_task_file_table.py, not by hand")
READ = "# read"                 # "# read<TAB>release<TAB>wheel sha256<TAB>task files": one line per wheel read
COLUMNS = "sha256\tpath\treleases"
HEX = re.compile(r"[0-9a-f]{64}")
RELEASE = re.compile(r"(?:0|[1-9][0-9]{0,3})(?:\.(?:0|[1-9][0-9]{0,3})){1,3}")   # plain releases: 0.4.9.2, not .dev0
COUNT = re.compile(r"0|[1-9][0-9]{0,5}")
# a path under lm_eval/tasks/: "/"-separated names of these characters (some releases have spaces: "lai prompt/")
PATH = re.compile(r"(?:[A-Za-z0-9_.\- ]+/)*[A-Za-z0-9_.\- ]+\.py")


def release_key(release):
    """A release's sort key: 0.4.9.2 before 0.4.10."""
    return tuple(int(part) for part in release.split("."))


def path_problem(path):
    """Why `path` is not a path under lm_eval/tasks/ the table can hold, or None."""
    if len(path) > MAX_PATH_CHARS:
        return f"a path of {len(path)} characters (at most {MAX_PATH_CHARS})"
    if not PATH.fullmatch(path) or any(part in (".", "..") or part != part.strip() for part in path.split("/")):
        return "a relative path of a .py file under lm_eval/tasks/ (names of letters, digits, '_', '.', '-', ' ')"
    return None


@dataclass(frozen=True)
class Table:
    releases: tuple         # the releases read, oldest first
    wheels: dict            # release -> (wheel sha256, its count of task files)
    files: dict             # sha256 -> ((release, path), ...), release order then path


def _bad(table, n, expected, found):
    return Unreadable(f"{table}: line {n}: expected {expected}, found {cut(repr(found), 90)}")


def _read_lines(table, lines):
    """The `# read` lines: {release: (wheel sha256, count)} in release order, and the index of the column line."""
    wheels, i = {}, 1
    while i < len(lines) and lines[i].startswith(READ):
        fields = lines[i].split("\t")
        if len(fields) != 4 or fields[0] != READ:
            raise _bad(table, i + 1, f"'{READ}', release, wheel sha256, task files (4 tab-separated fields)",
                       lines[i])
        _, release, wheel, count = fields
        if not RELEASE.fullmatch(release) or not HEX.fullmatch(wheel) or not COUNT.fullmatch(count):
            raise _bad(table, i + 1, "a release like 0.4.9.2, 64 lowercase hex digits and a count", lines[i])
        if wheels and release_key(release) <= release_key(list(wheels)[-1]):
            raise _bad(table, i + 1, f"a release after {list(wheels)[-1]} (one line each, oldest first)", release)
        wheels[release] = (wheel, int(count))
        i += 1
    if not wheels:
        raise _bad(table, i + 1, f"'{READ}' lines naming the wheels read", lines[i] if i < len(lines) else "")
    if i >= len(lines) or lines[i] != COLUMNS:
        raise _bad(table, i + 1, f"the column line {COLUMNS!r}", lines[i] if i < len(lines) else "end of table")
    return wheels, i


def _row(table, n, line, wheels):
    """(sha256, path, releases) of one row line, each field checked."""
    fields = line.split("\t")
    if len(fields) != 3:
        raise Unreadable(f"{table}: line {n}: expected 3 tab-separated fields ({COLUMNS!r}), found {len(fields)}: "
                         f"{cut(repr(line), 90)}")
    sha, path, listed = fields
    if not HEX.fullmatch(sha):
        raise _bad(table, n, "a sha256 of 64 lowercase hex digits", sha)
    problem = path_problem(path)
    if problem:
        raise _bad(table, n, problem, path)
    releases = listed.split(",")
    unknown = [r for r in releases if r not in wheels]
    if unknown:
        raise _bad(table, n, f"releases of the '{READ}' lines ({', '.join(wheels)}), comma-separated", unknown[0])
    keys = [release_key(r) for r in releases]
    if keys != sorted(set(keys)):
        raise _bad(table, n, "each release once, oldest first", listed)
    return sha, path, releases


def read_table(table=TABLE):
    """The table at `table`, read strictly; raises Unreadable naming the table and the line."""
    table = Path(table)
    text = read_text(table, MAX_TABLE_BYTES)
    if not text.endswith("\n"):
        raise Unreadable(f"{table}: line {text.count(chr(10)) + 1}: expected a line ending in a newline, found the "
                         "end of the file (a cut table)")
    lines = text[:-1].split("\n")
    if lines[0] != TITLE:
        raise _bad(table, 1, f"the title line {TITLE!r}", lines[0])
    wheels, columns = _read_lines(table, lines)
    seen, previous, files = {}, None, {}
    counts = dict.fromkeys(wheels, 0)
    for n, line in enumerate(lines[columns + 1:], start=columns + 2):
        sha, path, releases = _row(table, n, line, wheels)
        if (path, sha) in seen:
            raise _bad(table, n, f"one line per (sha256, path); line {seen[path, sha]} has this one", line)
        if previous is not None and (path, sha) < previous:
            raise _bad(table, n, "lines sorted by path, then sha256", line)
        seen[path, sha], previous = n, (path, sha)
        for release in releases:
            counts[release] += 1
            files.setdefault(sha, []).append((release, path))
    for i, (release, (_, count)) in enumerate(wheels.items(), start=2):
        if counts[release] != count:
            raise _bad(table, i, f"{counts[release]} task files of {release} (the lines naming it)", count)
    files = {sha: tuple(sorted(pairs, key=lambda p: (release_key(p[0]), p[1]))) for sha, pairs in files.items()}
    return Table(tuple(wheels), wheels, files)


@lru_cache(maxsize=1)
def _default():
    return read_table(TABLE)


def identify(path):
    """(sha256 of the file at `path`, [(release, path under lm_eval/tasks/), ...] of every release read that ships
    those bytes, oldest first). Raises Unreadable for a file over MAX_FILE_BYTES, one that is not a regular file or
    cannot be read, and for a corrupt table."""
    data = read_bytes(path, MAX_FILE_BYTES)
    if len(data) > MAX_FILE_BYTES:      # the file grew after read_bytes looked at its size
        raise Unreadable(f"{path}: over {MAX_FILE_BYTES} bytes (no lm-eval task file is that large)")
    sha = hashlib.sha256(data).hexdigest()
    return sha, list(_default().files.get(sha, ()))


def releases_of(sha256):
    """The releases read that ship a file of these bytes (at any path under lm_eval/tasks/), oldest first; [] for
    none. `sha256` is 64 lowercase hex digits (a ValueError otherwise: a caller's mistake, not bad input)."""
    if not isinstance(sha256, str) or not HEX.fullmatch(sha256):
        raise ValueError(f"releases_of: expected 64 lowercase hex digits, found {cut(repr(sha256), 90)}")
    return list(dict.fromkeys(release for release, _ in _default().files.get(sha256, ())))
