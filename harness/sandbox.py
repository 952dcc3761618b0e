"""Run untrusted code in a separate, confined process and get its answers back as data.

`run_code(code, inputs, limits)` starts `python -I -S -B harness/jail.py` (a fresh interpreter: no site, no
user paths, no environment variables at all) in its own session, inside a fresh temporary directory, writes the
request on its stdin and reads at most `result_max_bytes` from its stdout. A wall-clock timer (`wall_s`, counted
from the child's "ready" line, after its set-up) kills the whole process group with SIGKILL; the temporary
directory is removed afterwards. jail.py documents the layers applied inside the child (namespaces or Landlock,
chroot, uid nobody, rlimits).

The child only ever sees the INPUTS of the io pairs; `score_io_pairs` compares its outputs with the expected
outputs here, in the parent. Comparison is on canonical JSON (sorted keys): 1 and 1.0 differ, True and 1 differ,
tuples equal lists.

Limits, honestly:
- The untrusted code can make any system call; it is the kernel (namespaces, uid nobody, Landlock, rlimits) that
  confines it, not Python. There is no seccomp filter.
- ctypes works inside the sandbox, in both modes: jail.py imports it (with libffi and libc) for its own set-up,
  so the untrusted code can call any libc function, i.e. make system calls directly. In "namespaces" mode the
  privileged ones fail (unshare, setuid, chroot: EPERM, as uid nobody with no capabilities; tested).
- In "namespaces" mode (root) the jail holds only the Python installation, read-only: an extension module that
  needs a shared library outside it, not already loaded by jail.py (zlib, hence base64/binascii; ssl), cannot
  be imported.
- In "landlock" mode (not root; untested on the machines here, where we are root) the code keeps the caller's
  uid: Landlock refuses files outside the installation and the working directory, TCP bind/connect, and signals
  to processes outside the sandbox, but UDP is not refused and prlimit/setpriority on the caller's other
  processes are not blocked; the working directory is an ordinary temporary directory, so the number of files
  the code writes there is bounded only by its time limits. Without Landlock ABI >= 4 code_exec refuses to run
  (SandboxUnavailable).
- A run is all or nothing: if f loops on the third input, the first two answers are lost with it.
"""
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

JAIL = Path(__file__).with_name("jail.py")

DEFAULT_LIMITS = {
    "cpu_s": 2,                      # RLIMIT_CPU soft (SIGXCPU); hard = cpu_s + 1 (SIGKILL)
    "startup_s": 30.0,               # from spawn to "ready" (interpreter start + set-up; generous for busy machines)
    "wall_s": 5.0,                   # from "ready" to the result: then SIGKILL to the process group
    "memory_bytes": 256 * 2**20,     # RLIMIT_AS
    "fsize_bytes": 2**20,            # RLIMIT_FSIZE: largest file the code may write
    "nofile": 32,                    # RLIMIT_NOFILE
    "tmpfs_bytes": 4 * 2**20,        # size of the jail's tmpfs (/work), namespaces mode
    "result_max_bytes": 2**20,       # bytes read back from the child; more is an error
    "mode": "auto",                  # auto | namespaces | landlock
}


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


def _kill_group(proc):
    """SIGKILL the child's process group while the child is not yet reaped (so the id cannot be reused)."""
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


def run_code(code, inputs, limits=None):
    """Run `code` confined, call f on each input (JSON values); return a SandboxResult."""
    lim = {**DEFAULT_LIMITS, **(limits or {})}
    request = json.dumps({"code": code, "inputs": [json.dumps(x, sort_keys=True) for x in inputs],
                          "limits": lim, "mode": lim["mode"]}).encode()
    workdir = tempfile.mkdtemp(prefix="harness-sandbox-")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", str(JAIL)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=workdir, env={},
                            start_new_session=True, close_fds=True)

    def feed():  # in a thread: a child that never reads its stdin cannot block us
        try:
            proc.stdin.write(request)
            proc.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass

    threading.Thread(target=feed, daemon=True).start()
    try:
        buf, outcome = _read(proc, lim, t0)
    finally:
        _kill_group(proc)
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
    except ValueError:
        raise SandboxUnavailable(f"sandbox child gave no status line (exit {proc.returncode})") from None
    if not status.get("ready"):
        raise SandboxUnavailable(f"sandbox set-up failed: {status.get('error')}")
    res.isolation = status["isolation"]
    if outcome == "too_big":
        res.error = f"result larger than {lim['result_max_bytes']} bytes"
    elif outcome == "timeout":
        res.error = f"wall-clock timeout after {lim['wall_s']} s"
    else:
        try:
            body = json.loads(rest)
            res.outputs, res.error = body.get("outputs"), body.get("error")
            if res.outputs is not None and (len(res.outputs) != len(inputs) or
                                            not all(isinstance(o, dict) for o in res.outputs)):
                res.outputs, res.error = None, "malformed result"
        except (ValueError, AttributeError):
            killed_by = {-signal.SIGXCPU: " (CPU limit)", -signal.SIGKILL: " (killed)",
                         -signal.SIGXFSZ: " (file size limit)"}
            res.error = f"no result (exit {proc.returncode}{killed_by.get(proc.returncode, '')})"
    return res


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
