"""Write evidence_audit/lmeval/task_files.tsv: the sha256 of every lm_eval/tasks/**/*.py file that each lm-eval wheel
given ships, one line per (sha256, path under lm_eval/tasks/) with the releases shipping exactly those bytes there.

    python tools/make_task_file_table.py /tmp/lmeval-wheels          # every *.whl in the folder
    python tools/make_task_file_table.py A.whl B.whl --out PATH      # these wheels, the table elsewhere

Each wheel's release is its METADATA `Version` (the wheel's file name is not trusted). Every wheel is read bounded:
its size, its member count, its METADATA and each task file (at most task_files.MAX_FILE_BYTES, the bound
identify() reads a file with, so every file the table holds can be identified). A wheel of another package, of a
version that is not a plain release (0.4.13.dev0), two wheels of one release, a task file the table cannot name:
one line on stderr, exit 2, nothing written. The table is written to a temporary file beside --out, read back
with the audit's own strict reader, then renamed into place; the same wheels give the same bytes.

The wheels come from PyPI (0.4.6 was never published there):

    for v in 0.4.5 0.4.7 0.4.8 0.4.9 0.4.9.1 0.4.9.2 0.4.10 0.4.11 0.4.12 0.4.13; do
        pip download lm_eval==$v --no-deps --only-binary=:all: -d /tmp/lmeval-wheels; done
"""
import argparse
import hashlib
import os
import re
import stat
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from evidence_audit.lmeval import task_files  # noqa: E402  (the repository root is put on the path just above)
from evidence_audit.reading import Unreadable  # noqa: E402

PREFIX = "lm_eval/tasks/"
MAX_WHEEL_BYTES = 256 << 20     # the 0.4.13 wheel is 9 MB
MAX_MEMBERS = 100_000           # the 0.4.13 wheel has 15,586
MAX_METADATA_BYTES = 1 << 20
METADATA = re.compile(r"[^/]+\.dist-info/METADATA")


class Refused(Exception):
    """A wheel this script will not read: the message is the one line printed."""


def wheel_paths(args):
    """The wheels named: each argument a wheel, or a folder whose *.whl files are all read (sorted)."""
    paths = []
    for arg in map(Path, args):
        if arg.is_dir():
            found = sorted(p for p in arg.iterdir() if p.suffix == ".whl")
            if not found:
                raise Refused(f"{arg}: a folder with no .whl file in it")
            paths += found
        else:
            paths.append(arg)
    return paths


def sha256_of(path):
    """The wheel's sha256, refusing anything but a regular file of at most MAX_WHEEL_BYTES."""
    try:
        st = path.stat()
    except OSError as e:
        raise Refused(f"{path}: cannot read ({e.strerror})")
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_WHEEL_BYTES:
        raise Refused(f"{path}: expected a wheel file of at most {MAX_WHEEL_BYTES} bytes, found "
                      f"{'a file of %d bytes' % st.st_size if stat.S_ISREG(st.st_mode) else 'no regular file'}")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def member_bytes(wheel, zf, info, limit):
    """A member's bytes, never more than `limit` decompressed (the size a zip declares is not trusted)."""
    if info.file_size > limit:
        raise Refused(f"{wheel}: {info.filename}: a member of {info.file_size} bytes (at most {limit} read)")
    with zf.open(info) as f:
        data = f.read(limit + 1)
    if len(data) != info.file_size:
        raise Refused(f"{wheel}: {info.filename}: declares {info.file_size} bytes, holds {len(data)} or more")
    return data


def release_of(wheel, zf, members):
    """The wheel's release: the Version of its one .dist-info/METADATA, whose Name must be lm-eval's."""
    found = [m for m in members if METADATA.fullmatch(m.filename)]
    if len(found) != 1:
        raise Refused(f"{wheel}: expected one *.dist-info/METADATA, found {len(found)}")
    raw = member_bytes(wheel, zf, found[0], MAX_METADATA_BYTES)
    try:
        header = raw.decode("utf-8").split("\n\n", 1)[0]
    except UnicodeDecodeError as e:
        raise Refused(f"{wheel}: {found[0].filename}: not UTF-8 ({e.reason} at byte {e.start})")
    fields = {}
    for line in header.split("\n"):
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version"):
            fields.setdefault(key, []).append(value.strip())
    name, version = fields.get("Name", []), fields.get("Version", [])
    if len(name) != 1 or re.sub(r"[-_.]+", "-", name[0]).lower() != "lm-eval":
        raise Refused(f"{wheel}: {found[0].filename}: expected one 'Name: lm_eval', found {name}")
    if len(version) != 1 or not task_files.RELEASE.fullmatch(version[0]):
        raise Refused(f"{wheel}: {found[0].filename}: expected one 'Version:' of a plain release (like 0.4.9.2), "
                      f"found {version}")
    return version[0]


def read_wheel(wheel):
    """(release, wheel sha256, {path under lm_eval/tasks/: sha256}) of one wheel."""
    wheel_sha = sha256_of(wheel)
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = zf.infolist()
            if len(members) > MAX_MEMBERS:
                raise Refused(f"{wheel}: {len(members)} members (at most {MAX_MEMBERS} read)")
            names = [m.filename for m in members]
            if len(set(names)) != len(names):
                twice = next(n for n in names if names.count(n) > 1)
                raise Refused(f"{wheel}: the member {twice} twice (which copy an installer keeps is not defined)")
            release = release_of(wheel, zf, members)
            files = {}
            for info in members:
                if info.is_dir() or not info.filename.startswith(PREFIX) or not info.filename.endswith(".py"):
                    continue
                path = info.filename[len(PREFIX):]
                problem = task_files.path_problem(path)
                if problem:
                    raise Refused(f"{wheel}: {info.filename}: expected {problem}")
                files[path] = hashlib.sha256(member_bytes(wheel, zf, info, task_files.MAX_FILE_BYTES)).hexdigest()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as e:
        raise Refused(f"{wheel}: not a readable wheel ({str(e)[:120]})")
    if not files:
        raise Refused(f"{wheel}: no {PREFIX}**/*.py file (an lm-eval wheel ships its tasks)")
    return release, wheel_sha, files


def table_text(wheels):
    """The table of {release: (wheel sha256, files)}: the `# read` lines oldest first, rows sorted by path, then
    sha256, each row's releases oldest first."""
    order = sorted(wheels, key=task_files.release_key)
    rows = {}
    for release in order:
        for path, sha in wheels[release][1].items():
            rows.setdefault((path, sha), []).append(release)
    lines = [task_files.TITLE]
    lines += [f"{task_files.READ}\t{r}\t{wheels[r][0]}\t{len(wheels[r][1])}" for r in order]
    lines.append(task_files.COLUMNS)
    lines += [f"{sha}\t{path}\t{','.join(releases)}" for (path, sha), releases in sorted(rows.items())]
    return "\n".join(lines) + "\n"


def write_checked(out, text):
    """Temp file beside `out`, read back by the audit's reader, fsync, rename: `out` is the old table or the new."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        task_files.read_table(tmp)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheels", nargs="+", help="lm-eval wheels, or folders of them")
    parser.add_argument("--out", type=Path, default=task_files.TABLE, help="the table (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        wheels = {}
        for path in wheel_paths(args.wheels):
            release, wheel_sha, files = read_wheel(path)
            if release in wheels:
                raise Refused(f"{path}: a second wheel of release {release} (the first: {wheels[release][2]})")
            wheels[release] = (wheel_sha, files, path)
        text = table_text({r: (sha, files) for r, (sha, files, _) in wheels.items()})
        write_checked(args.out, text)
    except (Refused, Unreadable) as e:
        print(f"make_task_file_table: {e}", file=sys.stderr)
        return 2
    order = sorted(wheels, key=task_files.release_key)
    print(f"{args.out}: {text.count(chr(10))} lines, {len(text.encode('utf-8'))} bytes; task files per release: "
          + ", ".join(f"{r} {len(wheels[r][1])}" for r in order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
