"""Run untrusted code in a separate, confined process and get its answers back as data.

`run_code(code, inputs, limits)` starts harness/jail.py in a fresh interpreter (`python -I -S -B`: no site, no
user paths, no environment variables at all) in its own session, writes the request on its stdin and reads at
most `result_max_bytes` from its stdout. A wall-clock timer (`wall_s`, counted from the child's "ready" line,
after its set-up) ends the run; at the end of every run, whatever happened, the child's whole process tree is
frozen (SIGSTOP) and killed (SIGKILL) from /proc (harness/proctree.py), then the child itself, then the
temporary directory is removed.

Two backends; the one that ran is recorded in the isolation info (`backend`, `mode`, `layers`, `pidns`):
- "bwrap" (the first choice: mode "auto" when `bwrap` is on PATH and starts Python here, probed once per
  process; Debian package `bubblewrap`): bubblewrap makes new PID, mount, network, IPC, UTS (and cgroup)
  namespaces holding only /usr/lib(64) and the Python installation, read-only, a /dev and an empty /work (no
  /proc, /etc, /tmp, /usr/local, /usr/bin, home directories or other host files); --die-with-parent,
  --new-session. Run as root it uses no user namespace and grants jail.py CAP_SYS_ADMIN/SETUID/SETGID, which
  jail.py uses to mount an inode- and size-capped tmpfs on /work and to become the real uid nobody (so
  RLIMIT_NPROC counts), then drops every capability. Not root, bwrap maps uid nobody in a user namespace; the
  number of files in /work is then bounded only by time.
- "jail" (fallback, or mode "namespaces"/"landlock" asked for): jail.py makes the namespaces itself (root:
  "namespaces", with a PID namespace) or relies on Landlock alone (not root: "landlock"; run as root it also
  gets a PID namespace, keeps uid 0 and drops every capability).
In both, jail.py's supervisor is a child subreaper that follows the harness (PR_SET_PDEATHSIG: if the harness
dies, even by SIGKILL, it kills its tree), the untrusted worker runs under a trusted pid-1 init in its own PID
namespace (bwrap's or jail.py's; none only in "landlock" mode not run as root), and inside it: no_new_privs, Landlock (filesystem, TCP, signal and
abstract-socket scoping), a seccomp filter that refuses fork/vfork/clone/clone3 (x86_64), rlimits.

What that gives (tests/test_sandbox.py tries each, with a control showing the attack works unconfined):
- Processes: nothing outside the sandbox's PID namespace can be named, so no kill, prlimit, setpriority,
  ptrace, sched_setaffinity, ioprio_set or pidfd_open reaches another sandbox or the harness; a correct
  solution next to a hostile one still scores 1.
- Descendants: none can be created by default (seccomp); with that layer off, none outlives the run in any
  mode: the namespace's init exits with the worker and the kernel kills the rest, and without a PID namespace
  (not root, landlock) the subreaper supervisor finds and kills every orphan; sandbox.py kills the tree again
  (that is what ends a run that timed out), and a killed harness takes the tree with it.
- The result channel (the child's stdout, which the untrusted code can write to directly): bounded in size
  (result_max_bytes), in time (wall_s: a child that writes half a line and sleeps is cut off) and in form:
  read_result parses it with harness/strict_json (strict UTF-8, depth, no duplicate keys, no NaN/Infinity, no
  huge integers, no lone surrogates) and checks the exact shape jail.py writes. Any violation is a 0 score
  with a one-line reason; nothing the child writes can raise in, or stall, the parent.

Three options, off by default (code_exec uses none; the audit's task code, evidence_audit/lmeval/task_code.py, uses
all three): "import_dirs" (directories, e.g. a site-packages, bound read-only, at /ro/<i>/<their name> where a mount
namespace is made and at their own path under Landlock alone, and put on the code's sys.path; /usr/lib(64) and
/dev/null then also reach the jail's modes, as bubblewrap always gives them); "threads": N (the seccomp filter lets
clone make a thread, CLONE_THREAD, and nothing else; RLIMIT_NPROC is N, counted over the sandbox's uid, ignored for
root); and run_code(raw=True), which hands back the result line unparsed for a caller with its own strict reader.

The child only ever sees the INPUTS of the io pairs; `score_io_pairs` compares its outputs with the expected
outputs here, in the parent. Comparison is on canonical JSON (sorted keys): 1 and 1.0 differ, True and 1 differ,
tuples equal lists.

Limits, honestly:
- The untrusted code can make any system call but fork/clone; it is the kernel (namespaces, uid nobody,
  Landlock, seccomp, rlimits) that confines it, not Python.
- ctypes works inside the sandbox: jail.py imports it (with libffi and libc) for its own set-up, so the
  untrusted code can call any libc function. In the jail's "namespaces" mode, as uid nobody with no capabilities,
  the privileged calls fail (unshare, setuid, chroot: EPERM; tested). Under bwrap the code runs in bwrap's own
  user namespace, where unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID) and chroot("..") return 0 (measured);
  what holds there is containment, not EPERM: no host file outside the installation becomes visible after them,
  and there is no network (tested).
- Only the Python installation (and, under bwrap, /usr/lib and /usr/lib64) is visible, read-only. Under bwrap
  extension modules import normally (zlib, base64, ssl, sqlite3: tested); in the jail's "namespaces" mode an
  extension module that needs a shared library outside the installation, not already loaded by jail.py (zlib,
  hence base64/binascii; ssl), cannot be imported.
- "landlock" mode (not root; tested here only as root, where it gets a PID namespace and drops capabilities,
  and with the PID namespace switched off): Landlock refuses files outside the installation and the working
  directory, TCP bind/connect, and signals to processes outside the sandbox, but UDP is not refused, and
  without a PID namespace prlimit/setpriority on the caller's other processes of the same uid are not blocked;
  the working directory is an ordinary temporary directory, so the number of files the code writes there is
  bounded only by its time limits. Without Landlock ABI >= 4 code_exec refuses to run (SandboxUnavailable).
- bwrap's --die-with-parent fires when the THREAD that started it exits: run_code waits for the child on the
  thread that started it, so this holds as long as it is not abandoned mid-run.
- A run is all or nothing: if f loops on the third input, the first two answers are lost with it.
"""
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import proctree, strict_json

JAIL = Path(__file__).with_name("jail.py")
PROCTREE = Path(__file__).with_name("proctree.py")
USR_LIBS = ("/usr/lib", "/usr/lib64")  # the shared libraries; nothing else of /usr (no /usr/local, /usr/bin)

DEFAULT_LIMITS = {
    "cpu_s": 2,                      # RLIMIT_CPU soft (SIGXCPU); hard = cpu_s + 1 (SIGKILL)
    "startup_s": 30.0,               # from spawn to "ready" (interpreter start + set-up; generous for busy machines)
    "wall_s": 5.0,                   # from "ready" to the result: then SIGKILL to the process group
    "memory_bytes": 256 * 2**20,     # RLIMIT_AS
    "fsize_bytes": 2**20,            # RLIMIT_FSIZE: largest file the code may write
    "nofile": 32,                    # RLIMIT_NOFILE
    "tmpfs_bytes": 4 * 2**20,        # size of the jail's tmpfs (/work), namespaces mode
    "result_max_bytes": 2**20,       # bytes read back from the child; more is an error
    "mode": "auto",                  # auto | namespaces | landlock | bwrap (auto: bwrap when installed)
}
# Not in DEFAULT_LIMITS (config.py mirrors it), for the tests that show each layer holds on its own:
# "pidns": False (jail: no PID namespace, the subreaper alone), "no_fork": False (no seccomp filter), "nproc": n.



class SandboxUnavailable(RuntimeError):
    """The sandbox could not be set up (before any untrusted code ran): code_exec refuses to score."""


@dataclass
class SandboxResult:
    outputs: list = None          # one {"ok", "value"|"error"} per input, or None when the run failed
    error: str = None             # why there are no outputs (exec error, timeout, crash, oversized result)
    timed_out: bool = False
    isolation: dict = field(default_factory=dict)
    wall_s: float = 0.0
    returncode: int = None
    raw: bytes = None             # run_code(raw=True): the result line as the child wrote it, unparsed


def _kill_all(proc):
    """Freeze and SIGKILL everything below the child (proctree), then the child itself, while it is not yet
    reaped (so no id can be reused)."""
    proctree.kill_tree(proc.pid)
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def _exited(pid):
    """True once the child has exited; it stays a zombie (WNOWAIT) until proc.wait() reaps it."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _read(proc, lim, t0):
    """Read the child's stdout: its status line within startup_s of the spawn, then the result within wall_s
    of the status line (so a slow start on a busy machine does not eat the code's time). Returns (bytes,
    outcome) with outcome one of "done", "timeout", "too_big"."""
    fd, buf, deadline, started = proc.stdout.fileno(), b"", t0 + lim["startup_s"], False
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return buf, "timeout"
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > lim["result_max_bytes"]:
            return buf, "too_big"
        if not started and b"\n" in buf:
            started, deadline = True, time.monotonic() + lim["wall_s"]
    while not _exited(proc.pid):  # end of output: give the process until the deadline to exit
        if time.monotonic() >= deadline:
            return buf, "timeout"
        time.sleep(0.005)
    return buf, "done"


def import_dirs(lim):
    """[(directory outside, where the code sees it)] of the limits' "import_dirs": each at /ro/<i>/<its name> under
    bubblewrap and the namespaces jail (a mount namespace: /work, which may hold it, is the sandbox's own tmpfs; the
    name is kept because libraries read it: dill pickles a module whose path has "site-packages" by reference), at
    its own path under Landlock alone. SandboxUnavailable for one that is not an existing absolute directory."""
    dirs = [os.path.realpath(d) for d in lim.get("import_dirs", ())]
    bad = [d for d in lim.get("import_dirs", ()) if not (os.path.isabs(d) and os.path.isdir(d))]
    if bad:
        raise SandboxUnavailable(f"import_dirs: {bad[0]} is not an existing absolute directory")
    same = lim["mode"] == "landlock"
    return [(d, d if same else f"/ro/{i}/{os.path.basename(d)}") for i, d in enumerate(dirs)]


def _bwrap_command(imports=()):
    """bubblewrap around jail.py: new PID, mount, network, IPC, UTS and cgroup namespaces (and user, not root),
    /usr/lib(64) and the Python installation read-only, /dev, an empty /work; no /proc, /etc, /tmp or /home.
    `imports`: import_dirs' pairs, each bound read-only where the code sees it."""
    python, prefix = os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)
    binds, made = [], {"/"}
    for path in [d for d in USR_LIBS if os.path.isdir(d)] + [prefix] + \
            ([] if python.startswith(prefix + os.sep) else [python]):
        for d in map(str, reversed(Path(path).parents)):  # world-traversable parents (bwrap makes them 0700)
            if d not in made:
                binds += ["--perms", "0755", "--dir", d]
                made.add(d)
        binds += ["--ro-bind", path, path]
        made.add(path)
    links = [a for d in ("lib", "lib64") if os.path.islink(f"/{d}")
             for a in ("--symlink", os.readlink(f"/{d}"), f"/{d}")]
    # root: no user namespace, three capabilities for jail.py to mount /work and become nobody (then it drops them)
    user = ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] \
        if os.geteuid() == 0 else ["--unshare-user", "--uid", "65534", "--gid", "65534"]
    return [shutil.which("bwrap"), "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL",
            "--hostname", "sandbox", *user,
            *binds, *links, *_import_binds(imports),
            "--ro-bind", str(JAIL), "/jail/jail.py", "--ro-bind", str(PROCTREE), "/jail/proctree.py",
            "--dev", "/dev", "--size", "65536", "--tmpfs", "/work", "--chdir", "/work",
            "--", python, "-I", "-S", "-B", "/jail/jail.py"]


def _import_binds(imports):
    """bubblewrap's arguments for import_dirs' pairs: /ro/<i> made world-traversable, each directory bound there."""
    made = dict.fromkeys(d for _, inside in imports for d in (str(Path(inside).parents[1]), str(Path(inside).parent)))
    return [*[a for d in made for a in ("--perms", "0755", "--dir", d)],
            *[a for outside, inside in imports for a in ("--ro-bind", outside, inside)]]


@functools.lru_cache(maxsize=1)
def bwrap_works():
    """True when `bwrap` is installed and can start Python here (once per process: unprivileged bubblewrap
    needs user namespaces, which a machine may forbid)."""
    if not shutil.which("bwrap"):
        return False
    argv = _bwrap_command()
    try:
        return subprocess.run(argv[:argv.index("--") + 2] + ["-I", "-S", "-c", "pass"], env={}, timeout=60,
                              stdin=subprocess.DEVNULL, capture_output=True).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _command(lim):
    """(argv, mode for jail.py, import_dirs' pairs): bubblewrap when mode is bwrap, or auto and bwrap works here;
    else the jail (auto: namespaces as root, else landlock, as jail.py decides it)."""
    if lim["mode"] == "bwrap" or (lim["mode"] == "auto" and bwrap_works()):
        if not shutil.which("bwrap"):
            raise SandboxUnavailable("sandbox mode bwrap asked for, but bwrap is not installed")
        imports = import_dirs({**lim, "mode": "bwrap"})
        return _bwrap_command(imports), "bwrap", imports
    mode = lim["mode"] if lim["mode"] != "auto" else "namespaces" if os.geteuid() == 0 else "landlock"
    return [sys.executable, "-I", "-S", "-B", str(JAIL)], mode, import_dirs({**lim, "mode": mode})


def _start(lim, request_fields):
    argv, mode, imports = _command(lim)
    request = json.dumps({**request_fields, "limits": lim, "mode": mode, "parent": os.getpid(),
                          "imports": imports}).encode()
    workdir = tempfile.mkdtemp(prefix=f"harness-sandbox-{os.getpid()}-")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            cwd=workdir, env={}, start_new_session=True, close_fds=True)

    def feed():  # in a thread: a child that never reads its stdin cannot block us
        try:
            proc.stdin.write(request)
            proc.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass

    threading.Thread(target=feed, daemon=True).start()
    return proc, workdir


def run_code(code, inputs, limits=None, raw=False):
    """Run `code` confined, call f on each input (JSON values); return a SandboxResult. raw=True leaves the result
    line unparsed (SandboxResult.raw, at most result_max_bytes): for a caller that reads it with its own strict,
    bounded parser (the audit's task code: evidence_audit/reading.py), since read_result's strict_json caps a line
    at 1 MiB."""
    lim = {**DEFAULT_LIMITS, **(limits or {})}
    t0 = time.monotonic()
    proc, workdir = _start(lim, {"code": code, "inputs": [json.dumps(x, sort_keys=True) for x in inputs]})
    try:
        buf, outcome = _read(proc, lim, t0)
    finally:
        _kill_all(proc)
        proc.stdout.close()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    res = SandboxResult(timed_out=outcome == "timeout", wall_s=round(time.monotonic() - t0, 4),
                        returncode=proc.returncode)
    status, newline, rest = buf.partition(b"\n")
    if not newline and outcome == "timeout":
        res.error = f"the sandbox did not start within {lim['startup_s']} s"
        return res
    try:
        status = json.loads(status)
        ready, res.isolation = status.get("ready"), status.get("isolation")
    except (ValueError, AttributeError):
        raise SandboxUnavailable(f"sandbox child gave no status line (exit {proc.returncode})") from None
    if not ready:
        raise SandboxUnavailable(f"sandbox set-up failed: {status.get('error')}")
    if outcome == "too_big":
        res.error = f"result larger than {lim['result_max_bytes']} bytes"
    elif outcome == "timeout":
        res.error = f"wall-clock timeout after {lim['wall_s']} s"
    elif raw:
        res.raw = rest
        res.error = None if rest.strip() else f"no result (exit {proc.returncode}{_exit_reason(proc.returncode)})"
    else:
        res.outputs, res.error = read_result(rest, len(inputs), proc.returncode)
    return res


def _exit_reason(returncode):
    """jail.py exits with 128 + the signal that killed the worker."""
    sig = returncode - 128 if returncode and returncode > 128 else -returncode if returncode and returncode < 0 else 0
    return {signal.SIGXCPU: " (CPU limit)", signal.SIGKILL: " (killed)", signal.SIGXFSZ: " (file size limit)"}.get(
        sig, "")


def read_result(data, n_inputs, returncode=0):
    """(outputs, error) from the result line the untrusted process wrote. Bounded and strict (harness/strict_json:
    strict UTF-8, nesting depth, no duplicate keys, NaN/Infinity, huge integers or lone surrogates; the size is
    bounded by result_max_bytes before this), and of the exact shape jail.py writes. Anything else gives
    (None, "<one-line reason>"): the example scores 0 and the run goes on; nothing here raises."""
    if not data.strip():
        return None, f"no result (exit {returncode}{_exit_reason(returncode)})"
    try:
        body = strict_json.loads(strict_json.decode_utf8(data, "result channel"), "result channel")
    except ValueError as e:  # StrictJSONError: one line, "result channel[:line]: [field ...: ]expected ..."
        return None, str(e).splitlines()[0][:300]
    if not isinstance(body, dict) or not set(body) <= {"outputs", "error"}:
        return None, "malformed result"
    outputs, error = body.get("outputs"), body.get("error")
    if outputs is None:
        return None, error if isinstance(error, str) else "malformed result"
    good = {True: "value", False: "error"}
    if not (isinstance(outputs, list) and len(outputs) == n_inputs and all(
            isinstance(o, dict) and o.get("ok") in good and set(o) == {"ok", good[o["ok"]]}
            and isinstance(o[good[o["ok"]]], str) for o in outputs)):
        return None, "malformed result"
    return outputs, None


def canonical(value):
    return json.dumps(value, sort_keys=True, allow_nan=False)


def score_io_pairs(code, io_pairs, limits=None):
    """Fraction of io pairs [x, y] with f(x) == y (canonical JSON), and the evidence for it."""
    res = run_code(code, [x for x, _ in io_pairs], limits)
    outputs = res.outputs or [{"ok": False, "error": res.error}] * len(io_pairs)
    matches = [o.get("ok") is True and o.get("value") == canonical(y) for o, (_, y) in zip(outputs, io_pairs)]
    details = {"matched": sum(matches), "total": len(io_pairs), "error": res.error, "timed_out": res.timed_out,
               "outputs": [o.get("value") if o.get("ok") is True else None for o in outputs],
               "isolation": res.isolation, "wall_s": res.wall_s}
    return sum(matches) / len(io_pairs), details
