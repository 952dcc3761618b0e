"""The code_exec sandbox against an attack corpus. Every attack defines an f whose expected output is only
reachable if the attack works, so every attack must score 0; side effects are checked outside the sandbox
(canary files in world-readable/-writable directories, a listening socket, a signal handler, process lists).
Ordinary correct code must still score 1."""
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
    before = set(Path(tempfile.gettempdir()).glob("harness-sandbox-*"))
    yield {"base": base, "outside": outside, "canary": canary, "secret": secret}
    assert canary.read_text() == secret, "canary modified"
    assert sorted(p.name for p in base.iterdir()) == ["canary.txt", "outside"], list(base.iterdir())
    assert list(outside.iterdir()) == [], list(outside.iterdir())
    assert set(Path(tempfile.gettempdir()).glob("harness-sandbox-*")) <= before, "sandbox temp dir left behind"
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


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_ATTACKS else n
                                  for n in ATTACKS])
def test_attack_scores_zero(name, world):
    code, arg, expected = ATTACKS[name]
    arg = {"outside": str(world["outside"]), "canary": str(world["canary"]), None: 0}[arg]
    expected = world["secret"] if expected == "SECRET" else expected
    t0 = time.monotonic()
    score, details = run(code, [[arg, expected]])
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
    _, details = run("def f(x):\n    return x\n", [[1, 1]])
    iso = details["isolation"]
    assert iso["mode"] == "namespaces" and iso["network"] == "netns" and iso["uid"] == NOBODY
    assert {"netns", "mountns+chroot", "uid-nobody", "rlimits"} <= set(iso["layers"])


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
