"""The sandboxed side of code_exec. NOT imported by the harness: sandbox.py runs this file as a script in a fresh
interpreter (`python -I -S -B jail.py`, empty environment, own session) and talks to it over stdin/stdout.

Everything above `run_untrusted` is trusted set-up and runs BEFORE any untrusted text is compiled:

  1. read the request (code + the io-pair INPUTS; the expected outputs never enter this process, so the code
     cannot read or forge them), keep stdout as the private result channel, point fds 0/1/2 at /dev/null;
  2. mode "namespaces" (we are root): new network, mount, IPC and UTS namespaces; a tmpfs mounted over the
     working directory becomes the new root, holding only a read-only bind of the Python installation and an
     empty, size-capped /work; chroot into it;  drop to uid/gid `nobody` with no supplementary groups (which
     clears every capability);
     mode "landlock" (not root): no namespaces; Landlock alone confines the filesystem to the Python
     installation (read-only) and the working directory, and refuses TCP bind/connect;
  3. no_new_privs, then Landlock in both modes where the kernel has it (filesystem rules as above, TCP refused,
     signals and abstract unix sockets scoped to the sandbox);
  4. resource limits: CPU seconds, address space, no new processes or threads, file size, open files, no core;
  5. one status line goes to the parent ("ready" + which layers are active) before the untrusted code runs, so
     the untrusted code cannot fake a set-up failure.

Then the code is exec'd, `f(x)` is called on each input, and one JSON line with the outputs follows. The parent
compares them with the expected outputs; it never trusts anything else this process says. The set-up uses ctypes,
which stays loaded: the untrusted code can import it and call libc too (sandbox.py says what that allows).
"""
import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x04000000, 0x08000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
NOBODY = 65534

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def enter_namespaces_and_jail(jail, python_prefix, tmpfs_bytes):
    """New net/mount/ipc/uts namespaces, a tmpfs root with the Python installation read-only, chroot."""
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount is seen outside, and vice versa
    mount("tmpfs", jail, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},nr_inodes=4096,mode=0755")
    inside = jail + python_prefix
    os.makedirs(inside, mode=0o755)
    mount(python_prefix, inside, None, MS_BIND)
    mount(None, inside, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.mkdir(jail + "/work", 0o700)
    os.chown(jail + "/work", NOBODY, NOBODY)
    os.chroot(jail)
    os.chdir("/work")
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)  # from root to non-root: the kernel clears all capabilities


def landlock(read_only, read_write):
    """Allow read on `read_only`, read/write on `read_write`, nothing else on any filesystem; refuse TCP
    bind/connect (ABI >= 4); scope signals and abstract unix sockets to this sandbox (ABI >= 6).
    Returns the list of layers applied ([] when the kernel has no Landlock)."""
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    abi = syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return []
    fs_all = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
    read = (1 << 2) | (1 << 3)                                       # READ_FILE | READ_DIR
    write = read | (1 << 1) | (1 << 4) | (1 << 5) | (1 << 7) | (1 << 8) | (1 << 14 if abi >= 3 else 0)
    attr = (ctypes.c_uint64 * 3)(fs_all, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    fd = syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    for path, access in [(p, read) for p in read_only] + [(p, write) for p in read_write]:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = PathBeneath(access, pfd)
        ret = syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0))
        os.close(pfd)
        if ret != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    if syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(fd)
    return ["landlock-fs"] + (["landlock-tcp"] if abi >= 4 else []) + (["landlock-scope"] if abi >= 6 else [])


def set_limits(lim):
    cpu = lim["cpu_s"]
    for res, value in [(resource.RLIMIT_CPU, (cpu, cpu + 1)),  # soft: SIGXCPU (catchable); hard: SIGKILL
                       (resource.RLIMIT_AS, (lim["memory_bytes"],) * 2),
                       (resource.RLIMIT_NPROC, (0, 0)),          # no fork, no threads (ignored for root)
                       (resource.RLIMIT_FSIZE, (lim["fsize_bytes"],) * 2),
                       (resource.RLIMIT_NOFILE, (lim["nofile"],) * 2),
                       (resource.RLIMIT_CORE, (0, 0))]:
        resource.setrlimit(res, value)


def set_up(req):
    """Everything before the untrusted code. Returns the isolation report; raises on any failure."""
    mode, layers = req["mode"], []
    python_prefix = os.path.realpath(sys.base_prefix)
    if mode == "auto":
        mode = "namespaces" if os.geteuid() == 0 else "landlock"
    if mode not in ("namespaces", "landlock"):
        raise ValueError(f"unknown sandbox mode {mode!r} (auto, namespaces, landlock)")
    if mode == "namespaces":
        enter_namespaces_and_jail(os.getcwd(), python_prefix, req["limits"]["tmpfs_bytes"])
        layers += ["netns", "mountns+chroot", "ipcns", "utsns", "uid-nobody"]
        work = "/work"
    else:
        work = os.getcwd()
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    layers += landlock([python_prefix], [work])
    network = "netns" if "netns" in layers else "landlock-tcp" if "landlock-tcp" in layers else None
    if network is None:
        raise RuntimeError("no network isolation available: need root (network namespace) or Landlock ABI >= 4")
    if mode == "landlock" and "landlock-fs" not in layers:
        raise RuntimeError("no filesystem isolation available: need root (mount namespace) or Landlock")
    set_limits(req["limits"])
    layers += ["rlimits"]
    return {"mode": mode, "network": network, "layers": layers, "uid": os.getuid()}


def run_untrusted(code, inputs):
    """Exec the code in a fresh namespace dict, then call f on each input. Returns one entry per input:
    {"ok": true, "value": <json-able result>} or {"ok": false, "error": "<exception type>"}."""
    namespace = {"__name__": "__candidate__"}
    try:
        exec(compile(code, "<candidate>", "exec"), namespace)
    except BaseException as e:  # noqa: BLE001  (SystemExit, KeyboardInterrupt included: it is untrusted)
        return {"error": f"exec: {type(e).__name__}"}
    f = namespace.get("f")
    if not callable(f):
        return {"error": "no callable f defined"}
    outputs = []
    for x in inputs:
        try:
            value = f(json.loads(x))
            outputs.append({"ok": True, "value": json.dumps(value, sort_keys=True, allow_nan=False)})
        except BaseException as e:  # noqa: BLE001
            outputs.append({"ok": False, "error": type(e).__name__})
    return {"outputs": outputs}


def main():
    req = json.loads(sys.stdin.buffer.read())
    result_fd = os.dup(1)
    null_fd = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null_fd, fd)
    try:
        isolation = set_up(req)
    except BaseException as e:  # noqa: BLE001
        os.write(result_fd, (json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n").encode())
        os._exit(3)
    os.write(result_fd, (json.dumps({"ready": True, "isolation": isolation}) + "\n").encode())
    # ---- from here on, untrusted code runs in this process ----
    result = run_untrusted(req["code"], req["inputs"])
    data = (json.dumps(result) + "\n").encode()
    while data:
        data = data[os.write(result_fd, data):]
    os._exit(0)


if __name__ == "__main__":
    main()
