"""The code_exec sandbox against an attack corpus. Every attack defines an f whose expected output is only
reachable if the attack works, so every attack must score 0; side effects are checked outside the sandbox
(canary files in world-readable/-writable directories, a listening socket, a signal handler, process lists).
Ordinary correct code must still score 1. The corpus runs against each backend there is (bubblewrap, the own
jail); the attacks on what lies outside one sandbox (other processes, the result channel, descendants, the
leaderboard write) each have a control that runs the same code, or feeds the same bytes to the old reader, WITHOUT
the sandbox and shows that it then succeeds. Tests that wait for a limit, or start and kill a harness, are marked slow."""
import os
import secrets
import shutil
import signal
import socket
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from harness.metrics import code_exec
from harness.sandbox import SandboxUnavailable, score_io_pairs

LIMITS = {"cpu_s": 1, "wall_s": 4.0}
NOBODY = 65534
HAVE_BWRAP = shutil.which("bwrap") is not None
ROOT = os.geteuid() == 0
# the corpus runs against every backend there is: bubblewrap (first choice when installed) and the own jail
CORPUS_MODES = (["bwrap"] if HAVE_BWRAP else []) + (["namespaces"] if ROOT else []) or ["auto"]


@pytest.fixture
def world(monkeypatch):
    """A world-readable canary and a world-writable directory outside the sandbox: only the sandbox, not file
    permissions, keeps the code away from them. Also a secret in this process's environment."""
    base = Path(tempfile.mkdtemp(prefix="harness-attack-target-"))
    base.chmod(0o755)
    outside = base / "outside"
    outside.mkdir()
    outside.chmod(0o777)
    canary = base / "canary.txt"
    secret = secrets.token_hex(8)
    canary.write_text(secret)
    canary.chmod(0o644)
    monkeypatch.setenv("HARNESS_TEST_SECRET", secret)
    before = set(Path(tempfile.gettempdir()).glob(f"harness-sandbox-{os.getpid()}-*"))
    yield {"base": base, "outside": outside, "canary": canary, "secret": secret}
    assert canary.read_text() == secret, "canary modified"
    assert sorted(p.name for p in base.iterdir()) == ["canary.txt", "outside"], list(base.iterdir())
    assert list(outside.iterdir()) == [], list(outside.iterdir())
    after = set(Path(tempfile.gettempdir()).glob(f"harness-sandbox-{os.getpid()}-*"))
    assert after <= before, "sandbox temp dir left behind"
    shutil.rmtree(base)


def run(code, io_pairs, **limits):
    return score_io_pairs(textwrap.dedent(code), io_pairs, {**LIMITS, **limits})


# ---- attacks whose success would be visible in the returned value -----------------------------------------
ATTACKS = {
    "os.system writes outside": ("""
        import os
        def f(x):
            os.system(f"echo pwned > {x}/system.txt")
            return open(f"{x}/system.txt").read().strip()
        """, "outside", "pwned"),
    "subprocess spawn": ("""
        import subprocess
        def f(x):
            return subprocess.run(["/bin/sh", "-c", "echo pwned"], capture_output=True, text=True).stdout.strip()
        """, None, "pwned"),
    "__subclasses__ walk to popen": ("""
        def f(x):
            for c in ().__class__.__base__.__subclasses__():
                if c.__name__ == "_wrap_close":
                    return c.__init__.__globals__["popen"]("id -u").read().strip()
        """, None, "0"),
    "__subclasses__ walk to system": ("""
        def f(x):
            for c in ().__class__.__base__.__subclasses__():
                if c.__name__ == "_wrap_close":
                    return c.__init__.__globals__["system"](f"touch {x}/walk.txt")
        """, "outside", 0),
    "read /etc/passwd": ("""
        def f(x):
            return open("/etc/passwd").read()[:5]
        """, None, "root:"),
    "read the canary": ("""
        def f(x):
            return open(x).read()
        """, "canary", "SECRET"),
    "write outside (absolute)": ("""
        def f(x):
            with open(f"{x}/abs.txt", "w") as fh:
                fh.write("pwned")
            return "written"
        """, "outside", "written"),
    "write outside (relative ../)": ("""
        def f(x):
            with open("../" * 12 + x.lstrip("/") + "/rel.txt", "w") as fh:
                fh.write("pwned")
            return "written"
        """, "outside", "written"),
    "write /tmp": ("""
        import os
        def f(x):
            open("/tmp/harness-sandbox-escape.txt", "w").write("pwned")
            return "written"
        """, None, "written"),
    "chroot escape": ("""
        import os
        def f(x):
            os.mkdir("e")
            os.chroot("e")
            os.chdir("../../../../..")
            os.chroot(".")
            return open("/etc/passwd").read()[:5]
        """, None, "root:"),
    "regain root": ("""
        import os
        def f(x):
            os.setuid(0)
            return os.getuid()
        """, None, 0),
    "environment variables": ("""
        import os
        def f(x):
            return os.environ.get("HARNESS_TEST_SECRET")
        """, None, "SECRET"),
    "parent's environment via /proc": ("""
        import os
        def f(x):
            return len(open(f"/proc/{os.getppid()}/environ", "rb").read()) > 0
        """, None, True),
    "fork bomb": ("""
        import os
        def f(x):
            while True:
                os.fork()
        """, None, "forked"),
    "threads": ("""
        import threading
        def f(x):
            t = threading.Thread(target=lambda: None)
            t.start()
            return "started"
        """, None, "started"),
    "memory bomb": ("""
        def f(x):
            hog = []
            while True:
                hog.append(bytearray(50 * 2**20))
        """, None, "allocated"),
    "one huge allocation": ("""
        def f(x):
            return len(bytearray(2**34))
        """, None, 2**34),
    "deep recursion": ("""
        import sys
        sys.setrecursionlimit(10**8)
        def down(n):
            return down(n + 1) + 1
        def f(x):
            return down(0)
        """, None, 1),
    "big file in the working directory": ("""
        def f(x):
            with open("big.bin", "wb") as fh:
                for _ in range(64):
                    fh.write(b"x" * 2**20)
            return "written"
        """, None, "written"),
    "many files": ("""
        def f(x):
            for i in range(20000):
                open(f"f{i}", "w").close()
            return "done"
        """, None, "done"),
    "ctypes syscalls": ("""
        def f(x):
            import ctypes
            libc = ctypes.CDLL(None)
            return libc.unshare(0x40000000) + libc.setuid(0)
        """, None, 0),
}


SLOW_ATTACKS = {"deep recursion"}  # runs until the CPU limit


@pytest.mark.parametrize("mode", CORPUS_MODES)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_ATTACKS else n
                                  for n in ATTACKS])
def test_attack_scores_zero(name, mode, world):
    code, arg, expected = ATTACKS[name]
    arg = {"outside": str(world["outside"]), "canary": str(world["canary"]), None: 0}[arg]
    expected = world["secret"] if expected == "SECRET" else expected
    t0 = time.monotonic()
    score, details = run(code, [[arg, expected]], mode=mode)
    assert score == 0.0, details
    assert time.monotonic() - t0 < LIMITS["wall_s"] + 3, details
    assert not Path("/tmp/harness-sandbox-escape.txt").exists()


@pytest.mark.slow  # waits for a limit to run out
def test_infinite_loop_is_stopped(world):
    t0 = time.monotonic()
    score, details = run("def f(x):\n    while True:\n        pass\n", [[1, 1]])
    assert score == 0.0 and details["outputs"] == [None]
    assert time.monotonic() - t0 < LIMITS["wall_s"] + 2
    assert "CPU limit" in details["error"] or details["timed_out"], details


@pytest.mark.slow  # waits for a limit to run out
def test_sleep_is_stopped_by_the_wall_clock(world):
    t0 = time.monotonic()
    score, details = run("import time\ndef f(x):\n    time.sleep(1000)\n    return 1\n", [[1, 1]], wall_s=1.5)
    assert score == 0.0 and details["timed_out"] and "wall-clock" in details["error"]
    assert time.monotonic() - t0 < 4


@pytest.mark.slow  # waits for a limit to run out
def test_signal_tricks_do_not_outlive_the_limits(world):
    code = """
        import os, signal
        def f(x):
            for s in (signal.SIGXCPU, signal.SIGTERM, signal.SIGALRM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
                signal.signal(s, signal.SIG_IGN)
            try:
                os.setsid()
            except OSError:
                pass
            while True:
                pass
        """
    t0 = time.monotonic()
    score, details = run(code, [[1, "survived"]])
    assert score == 0.0
    assert time.monotonic() - t0 < LIMITS["wall_s"] + 2


def test_killing_the_parent_fails(world):
    received = []
    old = signal.signal(signal.SIGUSR1, lambda *a: received.append(a))
    try:
        code = """
            import os, signal
            def f(x):
                os.kill(os.getppid(), signal.SIGUSR1)
                os.killpg(os.getpgid(os.getppid()), signal.SIGUSR1)
                return "sent"
            """
        score, details = run(code, [[1, "sent"]])
        time.sleep(0.2)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert score == 0.0 and received == [], details


@pytest.mark.slow  # waits for socket timeouts
def test_tcp_and_udp_to_localhost_receive_nothing(world):
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    tcp.settimeout(0.5)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    code = """
        import socket
        def f(x):
            tcp_port, udp_port = x
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                u.sendto(b"udp-leak", ("127.0.0.1", udp_port))
            except OSError:
                pass
            s = socket.create_connection(("127.0.0.1", tcp_port), timeout=1)
            s.sendall(b"tcp-leak")
            return "sent"
        """
    try:
        score, details = run(code, [[[tcp.getsockname()[1], udp.getsockname()[1]], "sent"]])
        assert score == 0.0, details
        with pytest.raises(socket.timeout):
            tcp.accept()
        if details["isolation"]["network"] == "netns":  # Landlock alone does not refuse UDP (sandbox.py)
            with pytest.raises(socket.timeout):
                udp.recvfrom(100)
    finally:
        tcp.close()
        udp.close()


def test_abstract_unix_socket_receives_nothing(world):
    name = f"\0harness-test-{secrets.token_hex(4)}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(name)
    srv.listen(1)
    srv.settimeout(0.5)
    code = """
        import socket
        def f(x):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect("\\0" + x)
            s.sendall(b"leak")
            return "sent"
        """
    try:
        score, details = run(code, [[name[1:], "sent"]])
        assert score == 0.0, details
        with pytest.raises(socket.timeout):
            srv.accept()
    finally:
        srv.close()


def test_fork_bomb_leaves_no_processes(world):
    def sandbox_procs():
        return [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == NOBODY]

    before = set(sandbox_procs())
    code = """
        import os
        def f(x):
            n = 0
            for _ in range(1000):
                try:
                    if os.fork() == 0:
                        while True:
                            pass
                    n += 1
                except OSError:
                    pass
            return n
        """
    score, details = run(code, [[1, 1000]])
    assert score == 0.0 and details["outputs"] == ["0"], details  # not one fork succeeded
    assert set(sandbox_procs()) <= before


def test_huge_output_on_every_descriptor_is_capped(world):
    code = """
        import os
        def f(x):
            chunk = b"x" * 2**20
            for _ in range(200):
                for fd in range(64):
                    try:
                        os.write(fd, chunk)
                    except OSError:
                        pass
            return "ok"
        """
    t0 = time.monotonic()
    score, details = run(code, [[1, "ok"]], result_max_bytes=2**16)
    assert score == 0.0 and "larger than" in details["error"], details
    assert time.monotonic() - t0 < LIMITS["wall_s"] + 2


def test_printing_is_harmless_noise():
    score, details = run("def f(x):\n    print('x' * 10**7)\n    return x + 1\n", [[1, 2], [5, 6]])
    assert score == 1.0, details


def test_exiting_early_scores_zero():
    score, details = run("import os\ndef f(x):\n    os._exit(0)\n", [[1, 1]])
    assert score == 0.0 and details["error"].startswith("no result"), details


def test_ordinary_code_scores_one():
    assert run("def f(x):\n    return 2 * x\n", [[1, 2], [3, 6], [-4, -8]])[0] == 1.0
    code = """
        import math, re, json, collections, itertools, functools, heapq, bisect, statistics, string
        def f(x):
            with open("scratch.txt", "w") as fh:
                fh.write(json.dumps(x))
            y = json.loads(open("scratch.txt").read())
            words = re.findall(r"[a-z]+", y["text"])
            return {"n": len(words), "top": collections.Counter(words).most_common(1)[0][0],
                    "fact": math.factorial(5), "mean": statistics.mean(y["nums"])}
        """
    pairs = [[{"text": "a b a", "nums": [1, 2, 3]}, {"fact": 120, "mean": 2, "n": 3, "top": "a"}]]
    score, details = run(code, pairs)
    assert score == 1.0, details
    assert details["isolation"]["network"] in ("netns", "landlock-tcp")


def test_partial_credit_and_strict_comparison():
    score, details = run("def f(x):\n    return x * 2\n", [[1, 2], [2, 5], [3, 6.0], [[1], [1, 1]]])
    assert score == 0.5 and details["matched"] == 2  # 6 != 6.0 (canonical JSON), [1]*2 == [1, 1]


def test_code_exec_metric_reads_fenced_code():
    reply = "Here you go:\n```python\ndef f(x):\n    return x + 1\n```\nThis adds one."
    assert code_exec(reply, ["unused"], {"io_pairs": [[1, 2], [2, 3]]}, LIMITS) == 1.0
    assert code_exec("not python at all", ["unused"], {"io_pairs": [[1, 2]]}, LIMITS) == 0.0


def test_a_set_up_failure_refuses_instead_of_scoring():
    with pytest.raises(SandboxUnavailable, match="sandbox set-up failed: ValueError: unknown sandbox mode 'bogus'"):
        run("def f(x):\n    return x\n", [[1, 1]], mode="bogus")


@pytest.mark.skipif(os.geteuid() != 0, reason="the namespaces mode needs root")
def test_isolation_layers_used_here():
    _, details = run("def f(x):\n    return x\n", [[1, 1]], mode="namespaces")
    iso = details["isolation"]
    assert iso["mode"] == "namespaces" and iso["network"] == "netns" and iso["uid"] == NOBODY
    assert {"netns", "mountns+chroot", "uid-nobody", "rlimits", "seccomp-nofork"} <= set(iso["layers"])
    assert iso["pidns"] is True and iso["backend"] == "jail"


@pytest.mark.skipif(os.geteuid() != 0, reason="the namespaces mode needs root")
def test_ctypes_works_but_privileged_syscalls_fail():
    """What sandbox.py says about ctypes: importable (jail.py loaded it), libc callable, and as uid nobody with no
    capabilities unshare, setuid and chroot fail with EPERM."""
    code = """
        import ctypes, errno
        def f(x):
            libc = ctypes.CDLL(None, use_errno=True)
            out = {"getuid": libc.getuid()}
            for name, call in [("unshare", lambda: libc.unshare(0x40000000)), ("setuid", lambda: libc.setuid(0)),
                               ("chroot", lambda: libc.chroot(b"/"))]:
                ret = call()
                out[name] = [ret, errno.errorcode.get(ctypes.get_errno())]
            return out
        """
    expected = {"getuid": NOBODY, "unshare": [-1, "EPERM"], "setuid": [-1, "EPERM"], "chroot": [-1, "EPERM"]}
    score, details = run(code, [[0, expected]], mode="namespaces")
    assert score == 1.0, details


LANDLOCK_ATTACKS = ["read /etc/passwd", "read the canary", "write outside (absolute)", "environment variables",
                    "parent's environment via /proc", "subprocess spawn"]


@pytest.mark.parametrize("name", LANDLOCK_ATTACKS)
def test_landlock_fallback_refuses(name, world):
    """The non-root fallback (Landlock only), forced here. Run as root it keeps uid 0, so only attacks that
    Landlock itself must stop are run (no fork bomb: root ignores RLIMIT_NPROC)."""
    code, arg, expected = ATTACKS[name]
    arg = {"outside": str(world["outside"]), "canary": str(world["canary"]), None: 0}[arg]
    expected = world["secret"] if expected == "SECRET" else expected
    score, details = run(code, [[arg, expected]], mode="landlock")
    assert details["isolation"]["mode"] == "landlock", details
    assert score == 0.0, details


def test_landlock_fallback_refuses_tcp_and_runs_ordinary_code(world):
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    tcp.settimeout(0.5)
    code = "import socket\ndef f(x):\n    socket.create_connection(('127.0.0.1', x), timeout=1).sendall(b'x')\n" \
           "    return 'sent'\n"
    try:
        score, details = run(code, [[tcp.getsockname()[1], "sent"]], mode="landlock")
        assert score == 0.0 and details["isolation"]["network"] == "landlock-tcp", details
        with pytest.raises(socket.timeout):
            tcp.accept()
    finally:
        tcp.close()
    assert run("import math\ndef f(x):\n    return math.isqrt(x)\n", [[17, 4]], mode="landlock")[0] == 1.0


CONTROLS = ["os.system writes outside", "subprocess spawn", "__subclasses__ walk to popen",
            "__subclasses__ walk to system", "read /etc/passwd", "read the canary", "write outside (absolute)",
            "write outside (relative ../)", "environment variables", "parent's environment via /proc", "threads"]


@pytest.mark.skipif(os.geteuid() != 0, reason="some controls expect root")
@pytest.mark.parametrize("name", CONTROLS)
def test_control_the_attack_works_without_the_sandbox(name, tmp_path, monkeypatch):
    """The corpus is not vacuous: run unconfined (a plain child interpreter, inherited environment), these
    attacks do reach their target value."""
    import json
    import subprocess
    import sys

    outside = tmp_path / "outside"
    outside.mkdir()
    canary = tmp_path / "canary.txt"
    canary.write_text("s3cret")
    monkeypatch.setenv("HARNESS_TEST_SECRET", "s3cret")
    code, arg, expected = ATTACKS[name]
    arg = {"outside": str(outside), "canary": str(canary), None: 0}[arg]
    expected = "s3cret" if expected == "SECRET" else expected
    probe = textwrap.dedent(code) + f"\nimport json as _j\nprint(_j.dumps(f({arg!r})))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == expected, out.stderr[-500:]


# ==== PID namespace, cross-sandbox interference, the result channel, descendants ==============================
# Every attack below comes with a control that runs the same code (or feeds the same bytes to the reader the
# harness used before) WITHOUT the sandbox and shows that it then succeeds.
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

from harness import leaderboard, proctree  # noqa: E402
from harness.sandbox import read_result  # noqa: E402

needs_root = pytest.mark.skipif(not ROOT, reason="needs root (namespaces mode, uid nobody victims)")
# the modes every cross-process attack is tried in; "landlock" is run as root here, where it gets a PID namespace
MODES = (["bwrap"] if HAVE_BWRAP else []) + (["namespaces", "landlock"] if ROOT else ["landlock"])


def as_user(user):
    """Python source that makes the interpreter uid `user` (after importing what the attacks use: the
    interpreter under /root is not readable by nobody)."""
    if user is None:
        return ""
    return (f"import ctypes, json, os, resource, signal, stat, time\nos.setgroups([])\n"
            f"os.setresgid({user}, {user}, {user})\nos.setresuid({user}, {user}, {user})\n")


def unconfined(code, arg, user=None, timeout=20):
    """The control: the same code in a plain child interpreter (optionally as another uid), f(arg) printed."""
    probe = as_user(user) + textwrap.dedent(code) + f"\nimport json as _j\nprint(_j.dumps(f({arg!r})), flush=True)\n"
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=timeout,
                         cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else out.stderr[-300:]


@pytest.fixture
def victim():
    """Another "sandbox": a process of uid nobody (all sandboxes ran as nobody, and still do), sleeping."""
    proc = subprocess.Popen(["sleep", "60"], user=NOBODY, group=NOBODY, extra_groups=[])
    time.sleep(0.05)
    yield proc
    proc.kill()
    proc.wait()


CROSS_ATTACKS = {  # f(victim pid) returns "done" only if it reached (or changed) the other process
    "see another process (kill 0)": ("""
        import os
        def f(x):
            try:
                os.kill(x, 0)
            except PermissionError:
                pass
            return "done"
        """, lambda p: True),
    "prlimit another sandbox": ("""
        import resource
        def f(x):
            resource.prlimit(x, resource.RLIMIT_CPU, (0, 0))
            return "done"
        """, lambda p: "Max cpu time              unlimited" in Path(f"/proc/{p.pid}/limits").read_text()),
    "setpriority another sandbox": ("""
        import os
        def f(x):
            os.setpriority(os.PRIO_PROCESS, x, 19)
            return "done"
        """, lambda p: psutil.Process(p.pid).nice() != 19),
    "kill another sandbox": ("""
        import os, signal
        def f(x):
            os.kill(x, signal.SIGKILL)
            return "done"
        """, lambda p: p.poll() is None),
    "ptrace another sandbox": ("""
        import ctypes
        def f(x):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.ptrace(16, x, 0, 0) != 0:  # PTRACE_ATTACH
                raise OSError(ctypes.get_errno(), "ptrace")
            libc.ptrace(17, x, 0, 0)  # PTRACE_DETACH
            return "done"
        """, lambda p: p.poll() is None),
    "pin another sandbox to one CPU": ("""
        import os
        def f(x):
            os.sched_setaffinity(x, {0})
            return "done"
        """, lambda p: len(psutil.Process(p.pid).cpu_affinity()) == len(os.sched_getaffinity(0))),
    "lower another sandbox's I/O priority": ("""
        import ctypes
        def f(x):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syscall(251, 1, x, (3 << 13)) != 0:  # ioprio_set(WHO_PROCESS, x, IDLE)
                raise OSError(ctypes.get_errno(), "ioprio_set")
            return "done"
        """, lambda p: psutil.Process(p.pid).ionice().ioclass != psutil.IOPRIO_CLASS_IDLE),
    "open a pidfd on another sandbox": ("""
        import os
        def f(x):
            os.close(os.pidfd_open(x))
            return "done"
        """, lambda p: True),
    "list host processes in /proc": ("""
        import os
        def f(x):
            return "done" if str(x) in os.listdir("/proc") else "not seen"
        """, lambda p: True),
}


@needs_root
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CROSS_ATTACKS))
def test_cross_sandbox_attack_fails(name, mode, victim, world):
    code, untouched = CROSS_ATTACKS[name]
    score, details = run(code, [[victim.pid, "done"]], mode=mode)
    assert score == 0.0, details
    assert details["isolation"]["pidns"] is True, details
    assert untouched(victim), f"{name}: the victim was changed"


@needs_root
@pytest.mark.parametrize("name", list(CROSS_ATTACKS))
def test_control_cross_sandbox_attack_works_unconfined(name, victim):
    """Without the sandbox, a process of the same uid (nobody, as every sandbox was) reaches the victim."""
    code, untouched = CROSS_ATTACKS[name]
    assert unconfined(code, victim.pid, user=NOBODY) == "done"
    time.sleep(0.05)
    if name not in ("see another process (kill 0)", "open a pidfd on another sandbox", "list host processes in /proc",
                    "ptrace another sandbox"):
        assert not untouched(victim), f"{name}: the control did not change the victim"


HOSTILE = """
    import os, resource, signal, time
    def f(x):
        end, hits = time.monotonic() + 1.5, 0
        while time.monotonic() < end:
            for pid in x + list(range(1, 64)):
                if pid == os.getpid():
                    continue
                for act in (lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (0, 0)),
                            lambda: os.setpriority(os.PRIO_PROCESS, pid, 19),
                            lambda: os.kill(pid, signal.SIGKILL)):
                    try:
                        act()
                        hits += 1
                    except OSError:
                        pass
        return hits
    """
VICTIM = """
    import time
    def f(x):
        end = time.monotonic() + 0.8
        while time.monotonic() < end:
            pass
        return 2 * x
    """


def _nobody_pids_below_us():
    pids = []
    for p in proctree.descendants(os.getpid()):
        try:  # a short-lived helper (bwrap's setup, a probe) can exit between the listing and this look
            if psutil.Process(p).uids().real == NOBODY:
                pids.append(p)
        except psutil.NoSuchProcess:
            pass
    return pids


@pytest.mark.slow  # two sandboxes for ~2 s
@needs_root
@pytest.mark.parametrize("mode", MODES)
def test_a_correct_solution_is_not_disturbed_by_a_concurrent_hostile_one(mode, world):
    """A correct solution runs while a hostile one, started next to it, prlimits, renices and SIGKILLs every
    process it can name: the host pids of every uid-nobody process under this test, and pids 1..63 of its own
    namespace. The correct one still scores 1; the hostile one hit nothing outside its own namespace."""
    victim_result = {}
    t = threading.Thread(target=lambda: victim_result.update(
        zip(("score", "details"), run(VICTIM, [[21, 42]], mode=mode, cpu_s=2))))
    t.start()
    try:
        deadline = time.monotonic() + 5
        while not _nobody_pids_below_us() and time.monotonic() < deadline:
            time.sleep(0.01)
        targets = _nobody_pids_below_us()
        assert targets or mode == "landlock"  # the landlock worker keeps uid 0 here
        targets = targets or [p for p in proctree.descendants(os.getpid()) if p != os.getpid()]
        _, hostile = run(HOSTILE, [[targets, -1]], mode=mode, cpu_s=5)  # its 1.5 s busy loop outlasts LIMITS' 1 s
    finally:
        t.join()  # even on failure: the victim's sandbox removes its temp dir before the fixture looks for it
    assert victim_result["score"] == 1.0, victim_result
    assert hostile["outputs"][0] is not None, hostile
    if mode != "landlock":  # uid nobody reaches nothing; the landlock worker (uid 0 here) may renice its own init
        assert int(hostile["outputs"][0]) == 0, hostile


@pytest.mark.slow
@needs_root
def test_control_a_hostile_process_disturbs_a_correct_one_unconfined(tmp_path):
    """The same pair unconfined, both as uid nobody: the correct one is killed before it answers."""
    victim = subprocess.Popen([sys.executable, "-I", "-c", as_user(NOBODY) + textwrap.dedent(VICTIM) +
                               "\nprint(f(21))\n"], stdout=subprocess.PIPE)
    time.sleep(0.1)
    unconfined(HOSTILE, [victim.pid], user=NOBODY)
    out, _ = victim.communicate(timeout=10)
    assert victim.returncode != 0 and out.strip() != b"42"


# ---- the result channel: bytes the untrusted process writes straight onto it ------------------------------
CHANNEL = """
    import os, stat
    def f(x):
        payload = bytes.fromhex(x)
        for fd in range(3, 64):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    while payload:
                        payload = payload[os.write(fd, payload):]
            except OSError:
                pass
        os._exit(0)
    """
ONE = b'{"outputs": [{"ok": true, "value": %s}]}\n'
CHANNEL_ATTACKS = {  # payload, the reason read_result gives, what the harness's old reader (json.loads) did
    "100,000 open brackets": (b"[" * 100_000, "nesting at most 64 deep", "RecursionError"),
    "lone surrogate (\\u escape)": (ONE % b'"\\ud800"', "found a lone surrogate", "accepted, unwritable"),
    "lone surrogate (raw CESU bytes)": (ONE % b'"\xed\xa0\x80"', "expected UTF-8 text", "accepted, unwritable"),
    "invalid UTF-8": (ONE % b'"\xff\xfe"', "expected UTF-8 text", "UnicodeDecodeError"),
    "huge integer": (ONE % (b"9" * 4000), "found one of 4000 digits", "accepted"),
    "NaN": (ONE % b"NaN", "expected a finite number, found NaN", "accepted"),
    "Infinity from an overflowing float": (ONE % b"1e999", "found 1e999", "accepted"),
    "duplicate keys": (b'{"outputs": [{"ok": false, "error": "x"}], "outputs": [{"ok": true, "value": "1", '
                       b'"value": "2"}]}\n', "found a duplicate key", "accepted"),
    "wrong shape (value not a string)": (ONE % b'{"a": 1}', "malformed result", "accepted"),
}


@pytest.mark.parametrize("name", list(CHANNEL_ATTACKS))
def test_result_channel_attack_scores_zero_with_a_reason(name, world, tmp_path):
    payload, reason, _ = CHANNEL_ATTACKS[name]
    score, details = run(CHANNEL, [[payload.hex(), "1"]])
    assert score == 0.0 and reason in details["error"], details
    board = tmp_path / "leaderboard.json"  # the evidence of the failure can be written, and read back
    leaderboard.write(board, {"schema": leaderboard.SCHEMA, "details": details})
    assert leaderboard.load(board)["details"]["error"] == details["error"]


def _old_reader(rest, n_inputs):
    """What sandbox.py did with the result line before it checked its exact shape (kept here only as the
    control)."""
    try:
        body = json.loads(rest)
        outputs = body.get("outputs")
        if outputs is not None and (len(outputs) != n_inputs or not all(isinstance(o, dict) for o in outputs)):
            return None
        return outputs
    except (ValueError, AttributeError):
        return None


@pytest.mark.parametrize("name", list(CHANNEL_ATTACKS))
def test_control_the_old_reader_crashes_or_accepts(name):
    payload, _, old = CHANNEL_ATTACKS[name]
    if old == "RecursionError":
        with pytest.raises(RecursionError):  # escaped the old except clause: the whole run aborted
            _old_reader(payload, 1)
    elif old == "UnicodeDecodeError":
        with pytest.raises(UnicodeDecodeError):
            json.loads(payload)
        assert read_result(payload, 1)[0] is None
    else:
        outputs = _old_reader(payload, 1)
        assert outputs is not None, "the old reader refused it"
        if old == "accepted, unwritable":
            with pytest.raises(UnicodeEncodeError):  # what destroyed the leaderboard (non-atomic write)
                leaderboard.dumps({"outputs": outputs}).encode("utf-8")


def test_read_result_is_bounded_and_never_raises():
    for data in [b"", b"\n", b"{" * 10**6, b'"' * 10**5, b"\\" * 10**5, b"[]" * 10**5, b"1" * 10**6,
                 b'{"outputs": null, "error": 5}', b"\x00" * 100, ONE % b'"a"' + b"trailing"]:
        outputs, error = read_result(data, 1)
        assert outputs is None and error, data[:20]
    assert read_result(ONE % b'"1"', 1) == ([{"ok": True, "value": "1"}], None)
    assert read_result(ONE % b'"1"', 2)[1] == "malformed result"


@pytest.mark.slow  # waits for the wall clock
def test_a_result_that_never_ends_stalls_nothing(world):
    code = """
        import os, stat, time
        def f(x):
            for fd in range(3, 64):
                try:
                    if stat.S_ISFIFO(os.fstat(fd).st_mode):
                        os.write(fd, b'{"outputs": [')
                except OSError:
                    pass
            time.sleep(1000)
        """
    t0 = time.monotonic()
    score, details = run(code, [[1, 1]], wall_s=1.0)
    assert score == 0.0 and details["timed_out"] and time.monotonic() - t0 < 4, details


@pytest.mark.slow
def test_control_a_result_that_never_ends_stalls_a_plain_reader():
    code = "import time\nprint('{\"outputs\": [', flush=True)\ntime.sleep(1000)\n"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=1.5)


# ---- descendants that would outlive the run ----------------------------------------------------------------
DAEMON = """
    import ctypes, os, time
    def f(x):
        name, double = x
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if double and os.fork():
                os._exit(0)
            ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME: findable from outside
            time.sleep(30)  # holds every inherited descriptor, the result channel included
            os._exit(0)
        if double:
            os.waitpid(pid, 0)
        return "spawned"
    """
# the layers the descendant attacks are tried against, each with the layers above it switched off
DESCENDANT_SETUPS = {f"{m}{s}": (m, dict(no_fork=False, nproc=64, **extra)) for m in MODES for s, extra in
                     ([("", {})] + ([("-no-pidns", {"pidns": False})] if m == "landlock" else []))}


def _named(name):
    """Live processes (zombies are dead: they only wait for a parent to reap them) with this name."""
    return [p for p in psutil.process_iter(["name", "status"])
            if p.info["name"] == name and p.info["status"] != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("double", [False, True], ids=["fork+setsid", "double fork"])
@pytest.mark.parametrize("setup", list(DESCENDANT_SETUPS))
def test_no_descendant_outlives_the_run(setup, double, world):
    """With the fork ban lifted (nproc > 0, no seccomp), the daemon is spawned (score 1), yet it is gone when
    run_code returns: the PID namespace's init exits (namespaces, bwrap) or the subreaper supervisor kills the
    tree (landlock without a PID namespace); and the run does not wait for the daemon's copy of the channel."""
    mode, limits = DESCENDANT_SETUPS[setup]
    name = f"sbxd{secrets.token_hex(5)}"
    t0 = time.monotonic()
    score, details = run(DAEMON, [[[name, double], "spawned"]], mode=mode, **limits)
    assert score == 1.0, details
    assert time.monotonic() - t0 < 3, details
    time.sleep(0.2)
    survivors = _named(name)
    for p in survivors:
        p.kill()
    assert survivors == [], f"{setup}: a descendant outlived the run"


@pytest.mark.parametrize("mode", MODES)
def test_by_default_no_descendant_is_even_created(mode, world):
    name = f"sbxd{secrets.token_hex(5)}"
    score, details = run(DAEMON, [[[name, False], "spawned"]], mode=mode)
    assert score == 0.0 and details["outputs"] == [None] and "seccomp-nofork" in details["isolation"]["layers"]
    assert _named(name) == []


@pytest.mark.parametrize("double", [False, True], ids=["fork+setsid", "double fork"])
def test_control_the_descendant_outlives_its_parent_unconfined(double):
    name = f"sbxd{secrets.token_hex(5)}"
    code = textwrap.dedent(DAEMON) + f"\nprint(f({[name, double]!r}), flush=True)\n"
    proc = subprocess.Popen([sys.executable, "-I", "-c", code], stdout=subprocess.DEVNULL)
    proc.wait(timeout=10)
    time.sleep(0.3)
    survivors = _named(name)
    for p in survivors:
        p.kill()
    assert survivors, "the daemon did not outlive its parent"


def test_control_a_descendant_holding_the_pipe_stalls_a_plain_reader():
    name = f"sbxd{secrets.token_hex(5)}"
    code = textwrap.dedent(DAEMON) + f"\nprint(f({[name, False]!r}), flush=True)\n"
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, timeout=1.0)
    finally:
        for p in _named(name):
            p.kill()


def test_the_backend_that_ran_is_recorded():
    _, details = run("def f(x):\n    return x\n", [[1, 1]])
    iso = details["isolation"]
    assert iso["backend"] == ("bwrap" if HAVE_BWRAP else "jail") and iso["subreaper"] is True
    if HAVE_BWRAP:
        assert iso["mode"] == "bwrap" and "bwrap" in iso["layers"] and iso["uid"] == NOBODY
        if ROOT:
            assert "work-tmpfs-inode-cap" in iso["layers"]


# ---- the leaderboard (and its per-example dump) is written atomically -----------------------------------------
def _board(prediction):
    return {"schema": leaderboard.SCHEMA, "adapter": "t", "overall": 0.0, "tasks": {},
            "per_example": [{"task": "t", "id": "1", "prediction": prediction}]}


def test_an_unwritable_board_leaves_the_existing_leaderboard_whole(tmp_path):
    path = tmp_path / "leaderboard.json"
    leaderboard.write(path, _board("good"))
    before = path.read_bytes()
    with pytest.raises(ValueError, match="cannot write the leaderboard: surrogates not allowed") as e:
        leaderboard.write(path, _board("bad \ud800"))
    assert "\n" not in str(e.value)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["leaderboard.json"]


def test_a_failure_during_the_write_leaves_the_existing_leaderboard_whole(tmp_path, monkeypatch):
    path = tmp_path / "leaderboard.json"
    leaderboard.write(path, _board("good"))
    before = path.read_bytes()

    def full_disk(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError):
        leaderboard.write(path, _board("new"))
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["leaderboard.json"]


def test_control_a_plain_write_destroys_the_existing_leaderboard(tmp_path):
    """What a non-atomic write (open for writing, then encode) does with the same board: 0 bytes left."""
    path = tmp_path / "leaderboard.json"
    leaderboard.write(path, _board("good"))
    with pytest.raises(UnicodeEncodeError):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(leaderboard.dumps(_board("bad \ud800")))
    assert path.stat().st_size == 0


@pytest.mark.parametrize("content", [b"[" * 100_000, b'{"schema": "harness-leaderboard/v1", "schema": "x"}',
                                     b'{"schema": "harness-leaderboard/v1", "overall": NaN}', b"\xff"])
def test_a_bad_leaderboard_is_refused_in_one_line(tmp_path, content):
    path = tmp_path / "lb.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as e:
        leaderboard.load(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


# ---- the landlock fallback, run as root, keeps uid 0 but holds no capability ---------------------------------
CAPS = """
    import ctypes
    def f(x):
        header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        ctypes.CDLL(None).capget(header, data)
        return any(data)
    """


@needs_root
def test_landlock_fallback_as_root_holds_no_capability(world):
    score, details = run(CAPS, [[0, True]], mode="landlock")
    assert score == 0.0 and details["outputs"] == ["false"] and "no-capabilities" in details["isolation"]["layers"]


@needs_root
def test_control_root_holds_capabilities_unconfined():
    assert unconfined(CAPS, 0) is True


@pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap not installed")
def test_under_bwrap_extension_modules_import():
    code = ("import base64, zlib, sqlite3, ssl\n"
            "def f(x):\n    return base64.b64encode(zlib.compress(x.encode())).decode()\n")
    import base64
    import zlib
    assert run(code, [["abc", base64.b64encode(zlib.compress(b"abc")).decode()]], mode="bwrap")[0] == 1.0


HARNESS = """
import sys
sys.path.insert(0, {repo!r})
from harness.sandbox import run_code
run_code({code!r}, [[{name!r}, False]], {limits!r})
"""
DAEMON_THEN_WAIT = DAEMON.replace('        return "spawned"', '        time.sleep(30)\n        return "spawned"')


@pytest.mark.slow  # a harness process is started and killed
@pytest.mark.parametrize("setup", list(DESCENDANT_SETUPS))
def test_no_descendant_outlives_a_killed_harness(setup, tmp_path):
    """The harness itself is SIGKILLed mid-run (no finally runs in it): the supervisor (told by the kernel,
    PR_SET_PDEATHSIG) or bwrap (--die-with-parent) takes the whole tree down: worker, daemon, everything."""
    mode, limits = DESCENDANT_SETUPS[setup]
    name = f"sbxd{secrets.token_hex(5)}"
    script = HARNESS.format(repo=str(Path(__file__).resolve().parents[1]), code=textwrap.dedent(DAEMON_THEN_WAIT),
                            name=name, limits={**LIMITS, **limits, "mode": mode, "wall_s": 60.0, "cpu_s": 30})
    harness = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 10
    while not _named(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = proctree.descendants(harness.pid)
    assert _named(name) and tree, "the daemon never started"
    harness.kill()
    harness.wait()
    time.sleep(0.5)
    alive = [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    for p in alive + [q.pid for q in _named(name)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert alive == [] and _named(name) == [], f"{setup}: {alive} outlived the killed harness"


@pytest.mark.slow  # waits for the wall clock
@pytest.mark.parametrize("setup", list(DESCENDANT_SETUPS))
def test_no_descendant_outlives_a_timed_out_run(setup, world):
    """The worker spawns a daemon and then never answers: at the wall-clock limit sandbox.py freezes and kills
    the whole tree (worker, daemon, supervisor) itself."""
    mode, limits = DESCENDANT_SETUPS[setup]
    name = f"sbxd{secrets.token_hex(5)}"
    score, details = run(DAEMON_THEN_WAIT, [[[name, False], "spawned"]], mode=mode, wall_s=1.0, **limits)
    assert score == 0.0 and details["timed_out"], details
    time.sleep(0.2)
    survivors = _named(name)
    for p in survivors:
        p.kill()
    assert survivors == [], f"{setup}: a descendant outlived the timed-out run"


GROUP_SIGNAL = """
    import os, signal
    def f(x):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        os.kill(0, signal.SIGUSR1)  # every process of my process group
        os.killpg(os.getpgid(0), signal.SIGUSR1)
        return os.getpgid(0) == os.getpid()
    """


@pytest.mark.parametrize("mode", MODES)
def test_the_worker_has_its_own_process_group(mode, world):
    """A signal to the worker's own process group reaches only itself (it leads a fresh one), never the
    supervisor or init above it: the run still answers."""
    score, details = run(GROUP_SIGNAL, [[0, True]], mode=mode)
    assert score == 1.0, details


def test_control_a_child_shares_its_parents_process_group():
    """Unconfined, the code's process group is its parent's, so the same signal would reach the parent (not
    sent here: the parent is this test run)."""
    code = "import os\ndef f(x):\n    return os.getpgid(0) == os.getpgid(os.getppid())\n"
    assert unconfined(code, 0) is True


@pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap is not installed")
def test_under_bwrap_namespace_calls_may_succeed_but_reveal_no_host_file():
    """What sandbox.py says of bwrap: the code runs in bwrap's own user namespace, where unshare(CLONE_NEWUSER |
    CLONE_NEWNS | CLONE_NEWPID) and chroot("..") may return 0 (unlike the namespaces mode's EPERM); what holds is
    that no host file becomes visible after them."""
    code = """
        import ctypes, os
        def f(x):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.unshare(0x10000000 | 0x00020000 | 0x20000000)
            try:
                os.chroot("..")
            except OSError:
                pass
            return [p for p in ("/etc/passwd", "/etc/hostname", "/proc/1/environ", x) if os.path.exists(p)
                    and os.access(p, os.R_OK)]
        """
    host_file = str(Path(__file__).resolve())          # this test file: a host file outside the installation
    score, details = run(code, [[host_file, []]], mode="bwrap")
    assert score == 1.0, details


# ---- the options the audit's task code uses: import_dirs, threads, raw (evidence_audit/lmeval/task_code.py) -----

IMPORT_AND_WRITE = """
import os
import sys
def f(x):
    import probe_mod
    where = os.path.dirname(probe_mod.__file__)
    try:
        open(os.path.join(where, "written.txt"), "w").write("pwned")
        wrote = True
    except OSError:
        wrote = False
    return [probe_mod.VALUE, os.path.basename(where), wrote, sum(p.startswith("/ro/") for p in sys.path) > 0]
"""


@pytest.fixture
def import_dir(tmp_path):
    lib = tmp_path / "site-packages"
    lib.mkdir()
    (lib / "probe_mod.py").write_text("VALUE = 41 + 1\n")
    lib.chmod(0o777)        # writable by anyone: only the sandbox keeps the code from writing there
    return lib


@pytest.mark.parametrize("mode", MODES)
def test_import_dirs_are_importable_and_read_only(mode, import_dir, world):
    """A directory given as import_dirs is on the code's sys.path under its own name (at /ro/<i>/ with a mount
    namespace, at its path under Landlock alone) and cannot be written; without it the module is not there."""
    from harness.sandbox import run_code

    res = run_code(textwrap.dedent(IMPORT_AND_WRITE), [0], {**LIMITS, "mode": mode, "import_dirs": [str(import_dir)]})
    assert res.error is None, res.error
    value = json.loads(res.outputs[0]["value"])
    assert value[:3] == [42, "site-packages", False], value
    assert value[3] == (mode != "landlock") and "import-dirs" in res.isolation["layers"]
    assert not (import_dir / "written.txt").exists()
    res = run_code(textwrap.dedent(IMPORT_AND_WRITE), [0], {**LIMITS, "mode": mode})
    assert res.outputs == [{"ok": False, "error": "ModuleNotFoundError"}]


def test_an_import_dir_that_is_not_a_directory_refuses_before_running(tmp_path):
    from harness.sandbox import run_code

    with pytest.raises(SandboxUnavailable, match="not an existing absolute directory"):
        run_code("def f(x):\n    return x\n", [0], {**LIMITS, "import_dirs": [str(tmp_path / "nothing")]})


THREADS_NOT_PROCESSES = """
import os
import threading
def f(x):
    out = []
    t = threading.Thread(target=lambda: out.append("thread ran"))
    try:
        t.start()
        t.join()
    except RuntimeError as e:
        out.append("no thread")
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        out.append("forked")
    except OSError as e:
        out.append("no fork")
    return out
"""


@pytest.mark.parametrize("mode", MODES)
def test_threads_let_a_thread_start_but_never_a_process(mode, world):
    """"threads": N lets clone make a thread (CLONE_THREAD) while fork, vfork and every other clone still fail; by
    default neither starts."""
    from harness.sandbox import run_code

    code = textwrap.dedent(THREADS_NOT_PROCESSES)
    res = run_code(code, [0], {**LIMITS, "mode": mode, "threads": 8})
    assert json.loads(res.outputs[0]["value"]) == ["thread ran", "no fork"], res
    assert "seccomp-threads-only" in res.isolation["layers"]
    res = run_code(code, [0], {**LIMITS, "mode": mode})
    assert json.loads(res.outputs[0]["value"]) == ["no thread", "no fork"], res
    assert "seccomp-nofork" in res.isolation["layers"]


@pytest.mark.parametrize("mode", MODES)
def test_with_threads_a_subprocess_still_fails(mode, world):
    assert run(ATTACKS["subprocess spawn"][0], [[None, "pwned"]], mode=mode, threads=8)[0] == 0.0
    assert run(ATTACKS["os.system writes outside"][0], [[str(world["outside"]), "pwned"]], mode=mode,
               threads=8)[0] == 0.0


def test_raw_returns_the_result_line_unparsed():
    """raw=True hands the caller the bytes of the result line (bounded by result_max_bytes): a line the harness's
    own reader would refuse (over strict_json's 1 MiB) arrives whole."""
    from harness.sandbox import run_code

    res = run_code("def f(x):\n    return 'x' * (3 << 20)\n", [0], {**LIMITS, "result_max_bytes": 8 << 20}, raw=True)
    assert res.error is None and res.outputs is None and len(res.raw) > 3 << 20
    assert json.loads(json.loads(res.raw)["outputs"][0]["value"]) == "x" * (3 << 20)
    res = run_code("def f(x):\n    return 'x' * (3 << 20)\n", [0], {**LIMITS, "result_max_bytes": 1 << 20}, raw=True)
    assert res.raw is None and "larger than" in res.error
