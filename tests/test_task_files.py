"""evidence_audit/lmeval/task_files.py and tools/make_task_file_table.py: the table of the task files each lm-eval
release ships, against the lm-eval installed here (its task files must all be in the table under its own release
and path, and nothing else under that release), the tool on small wheels built here, and the refusals of a corrupt
table, of a file identify() will not read and of a wheel the tool will not read. No network, no lm_eval import
(the installed package is only located)."""
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import zipfile
from pathlib import Path

import pytest

from conftest import run_cli
from evidence_audit.lmeval import task_files
from evidence_audit.lmeval.versions import KNOWN_VERSIONS
from evidence_audit.reading import Unreadable

TOOL = "tools/make_task_file_table.py"


def installed_tasks():
    """(release, lm_eval/tasks/ directory) of the lm-eval installed in this venv, located without importing it."""
    spec = importlib.util.find_spec("lm_eval")
    assert spec is not None and spec.origin, "lm_eval is not installed in this venv"
    return importlib.metadata.version("lm_eval"), Path(spec.origin).parent / "tasks"


def test_every_installed_task_file_is_its_release_at_its_path():
    """Fails when the table is stale or wrong for the installed release: each .py file of the installed
    lm_eval/tasks/ is identified as that release at its own relative path, and the table gives that release no
    other file."""
    release, tasks = installed_tasks()
    files = sorted(p for p in tasks.rglob("*.py") if p.is_file())
    assert len(files) > 100, tasks
    wrong = []
    for path in files:
        rel = path.relative_to(tasks).as_posix()
        sha, pairs = task_files.identify(path)
        assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
        if (release, rel) not in pairs:
            wrong.append(f"{rel}: {pairs[:3]}")
    assert not wrong, f"{len(wrong)} installed file(s) not in the table as {release}:\n" + "\n".join(wrong[:10])
    table = task_files.read_table()
    listed = {p for pairs in table.files.values() for r, p in pairs if r == release}
    assert listed == {p.relative_to(tasks).as_posix() for p in files}
    assert table.wheels[release][1] == len(files)


def test_the_table_holds_the_releases_the_audit_reads():
    """The releases read are exactly those whose output the audit reads (versions.KNOWN_VERSIONS): a release added
    there without rebuilding the table fails here."""
    assert task_files.read_table().releases == tuple(KNOWN_VERSIONS)


def test_one_changed_byte_is_no_release(tmp_path):
    release, tasks = installed_tasks()
    original = (tasks / "hellaswag" / "utils.py").read_bytes()
    same = tmp_path / "same.py"
    same.write_bytes(original)
    sha, pairs = task_files.identify(same)
    assert (release, "hellaswag/utils.py") in pairs and release in task_files.releases_of(sha)
    assert task_files.releases_of(sha) == list(dict.fromkeys(r for r, _ in pairs))

    edited = tmp_path / "utils.py"
    i = original.index(b"def ")
    edited.write_bytes(original[:i] + b"D" + original[i + 1:])
    sha, pairs = task_files.identify(edited)
    assert sha == hashlib.sha256(edited.read_bytes()).hexdigest()
    assert pairs == [] and task_files.releases_of(sha) == []


def test_releases_of_takes_a_sha256_only():
    with pytest.raises(ValueError, match="64 lowercase hex"):
        task_files.releases_of("A" * 64)
    assert task_files.releases_of("0" * 64) == []


# ---- the tool, on wheels built here ------------------------------------------------------------------------------

def make_wheel(where, version, files, name="lm_eval"):
    """A wheel-shaped zip: a .dist-info/METADATA naming `name` and `version`, then `files` {member: bytes}."""
    path = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        # the description below the header says "Version:" too: only the header's counts
        zf.writestr(f"{name}-{version}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nVersion: 9.9 is not this one\n")
        for member, data in files.items():
            zf.writestr(member, data)
    return path


def sha(data):
    return hashlib.sha256(data).hexdigest()


def test_the_tool_writes_exactly_the_expected_table(tmp_path):
    """Two wheels (0.4.100 sorts after 0.4.99 by release, before it as text): a file both ship with the same bytes
    is one line naming both, a file whose bytes changed is two lines; non-task and non-.py members are left out."""
    util_a, util_b, spaced = b"def f():\n    return 1\n", b"def f():\n    return 2\n", b"X = 1\n"
    other = {"lm_eval/api/task.py": b"import os\n", "lm_eval/tasks/a/a.yaml": b"task: a\n", "lm_eval/tasks/a/": b""}
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "0.4.100", {"lm_eval/tasks/a/utils.py": util_b, "lm_eval/tasks/b c/x.py": spaced, **other})
    make_wheel(wheels, "0.4.99", {"lm_eval/tasks/a/utils.py": util_a, "lm_eval/tasks/b c/x.py": spaced, **other})
    out = tmp_path / "t" / "table.tsv"
    proc = run_cli(TOOL, wheels, "--out", out, timeout=120)
    assert proc.returncode == 0, proc.stderr
    w99, w100 = (sha((wheels / f"lm_eval-{v}-py3-none-any.whl").read_bytes()) for v in ("0.4.99", "0.4.100"))
    rows = sorted([(sha(util_a), "a/utils.py", "0.4.99"), (sha(util_b), "a/utils.py", "0.4.100"),
                   (sha(spaced), "b c/x.py", "0.4.99,0.4.100")], key=lambda r: (r[1], r[0]))
    expected = [task_files.TITLE, f"# read\t0.4.99\t{w99}\t2", f"# read\t0.4.100\t{w100}\t2", "sha256\tpath\treleases",
                *("\t".join(r) for r in rows)]
    assert out.read_text(encoding="utf-8") == "\n".join(expected) + "\n"
    assert f"{len(expected)} lines" in proc.stdout
    assert [p.name for p in out.parent.iterdir()] == ["table.tsv"]        # no temporary file left behind
    table = task_files.read_table(out)
    assert table.releases == ("0.4.99", "0.4.100")
    assert table.files[sha(spaced)] == (("0.4.99", "b c/x.py"), ("0.4.100", "b c/x.py"))


@pytest.mark.parametrize("case", ["oversized member", "same release twice", "another package", "dev release",
                                  "no wheel"])
def test_the_tool_refuses_a_wheel_in_one_line(tmp_path, case):
    ok = {"lm_eval/tasks/a/utils.py": b"X = 1\n"}
    args = [make_wheel(tmp_path, "0.4.5", ok)]
    if case == "oversized member":
        args = [make_wheel(tmp_path, "0.4.7", {"lm_eval/tasks/big.py": b"#" * (task_files.MAX_FILE_BYTES + 1)})]
        fragment = "lm_eval/tasks/big.py: a member of 4194305 bytes"
    elif case == "same release twice":
        (tmp_path / "other").mkdir()
        args.append(make_wheel(tmp_path / "other", "0.4.5", {"lm_eval/tasks/a/utils.py": b"X = 2\n"}))
        fragment = "a second wheel of release 0.4.5"
    elif case == "another package":
        args = [make_wheel(tmp_path, "0.4.5", ok, name="not_lm_eval")]
        fragment = "expected one 'Name: lm_eval', found ['not_lm_eval']"
    elif case == "dev release":
        args = [make_wheel(tmp_path, "0.4.13.dev0", ok)]
        fragment = "a plain release (like 0.4.9.2), found ['0.4.13.dev0']"
    else:
        (tmp_path / "empty").mkdir()
        args = [tmp_path / "empty"]
        fragment = "a folder with no .whl file in it"
    out = tmp_path / "table.tsv"
    proc = run_cli(TOOL, *args, "--out", out, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and fragment in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


# ---- a corrupt table ---------------------------------------------------------------------------------------------

def real_lines():
    lines = task_files.TABLE.read_text(encoding="utf-8").splitlines()
    return lines, lines.index(task_files.COLUMNS) + 2         # the 1-based line number of the first row


def corrupt(case):
    """(table text, the line the error must name, a fragment of the message) for one kind of corruption."""
    lines, first = real_lines()
    row = lines[first - 1].split("\t")
    at = first - 1
    if case == "bad hex":
        lines[at] = "\t".join(["G" * 64, *row[1:]])
        return lines, first, "expected a sha256 of 64 lowercase hex digits, found 'GGG"
    if case == "wrong column count":
        lines[at] = "\t".join([*row, "extra"])
        return lines, first, "expected 3 tab-separated fields ('sha256\\tpath\\treleases'), found 4: "
    if case == "duplicate":
        lines.insert(at + 1, lines[at])
        return lines, first + 1, f"line {first} has this one"
    if case == "unsorted":
        lines[at], lines[at + 5] = lines[at + 5], lines[at]     # the row after the moved one is out of order
        return lines, first + 1, "sorted by path"
    if case == "unknown release":
        lines[at] = "\t".join([*row[:2], "0.4.6"])
        return lines, first, "found '0.4.6'"
    if case == "releases out of order":
        lines[at] = "\t".join([*row[:2], "0.4.10,0.4.9"])
        return lines, first, "each release once, oldest first"
    if case == "path leaving tasks":
        lines[at] = "\t".join([row[0], "../api/task.py", row[2]])
        return lines, first, "a relative path of a .py file"
    if case == "a row lost":
        release = row[2].split(",")[0]
        del lines[at]
        return lines, 2 + task_files.read_table().releases.index(release), f"task files of {release} (the lines naming it), found"
    if case == "title":
        lines[0] = "# a table"
        return lines, 1, "expected the title line"
    raise AssertionError(case)


CASES = ["bad hex", "wrong column count", "duplicate", "unsorted", "unknown release", "releases out of order",
         "path leaving tasks", "a row lost", "title"]


def one_line_error(path):
    with pytest.raises(Unreadable) as e:
        task_files.read_table(path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{path}: line "), message
    return message


@pytest.mark.parametrize("case", CASES)
def test_a_corrupt_table_is_one_line_naming_the_table_and_the_line(tmp_path, case):
    lines, line, fragment = corrupt(case)
    path = tmp_path / "task_files.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    message = one_line_error(path)
    assert message.startswith(f"{path}: line {line}: ") and fragment in message, message


@pytest.mark.parametrize("case", ["oversized", "cut", "not utf-8"])
def test_a_table_that_is_not_text_of_its_size_is_refused(tmp_path, case):
    path = tmp_path / "task_files.tsv"
    text = task_files.TABLE.read_bytes()
    data = {"oversized": text + b"#" * (task_files.MAX_TABLE_BYTES + 1 - len(text)), "cut": text[:-20],
            "not utf-8": text.replace(b"hellaswag", b"hell\xffswag", 1)}[case]
    path.write_bytes(data)
    message = one_line_error(path)
    assert {"oversized": "over the audit's limit", "cut": "a cut table", "not utf-8": "not UTF-8"}[case] in message


def test_the_real_table_reads():
    table = task_files.read_table()
    lines, first = real_lines()
    assert sum(len(pairs) for pairs in table.files.values()) == sum(len(r.split("\t")[2].split(","))
                                                                    for r in lines[first - 1:])


# ---- files identify() will not read ------------------------------------------------------------------------------

def test_identify_refuses_an_oversized_file(tmp_path):
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * (task_files.MAX_FILE_BYTES + 1))
    refused = rf"^{re.escape(str(big))}: line 1: file of 4194305 bytes is over .* 4194304 bytes$"
    with pytest.raises(Unreadable, match=refused):
        task_files.identify(big)
    big.write_bytes(b"#" * task_files.MAX_FILE_BYTES)                 # at the cap it is read
    assert task_files.identify(big)[1] == []


def test_identify_refuses_what_is_not_a_regular_file(tmp_path):
    with pytest.raises(Unreadable, match=rf"^{re.escape(str(tmp_path))}: not a regular file"):
        task_files.identify(tmp_path)
    with pytest.raises(Unreadable, match=rf"^{re.escape(str(tmp_path / 'gone.py'))}: cannot read"):
        task_files.identify(tmp_path / "gone.py")
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "pipe.py"
        os.mkfifo(fifo)
        # refused on its stat, before any open (opening a pipe with no writer would wait for ever)
        with pytest.raises(Unreadable, match=rf"^{re.escape(str(fifo))}: not a regular file"):
            task_files.identify(fifo)
