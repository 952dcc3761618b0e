"""The sandboxed side of code_exec. NOT imported by the harness: sandbox.py runs this file as a script in a fresh
interpreter (`python -I -S -B jail.py`, empty environment, own session; under bubblewrap as /jail/jail.py) and
talks to it over stdin/stdout. It loads harness/proctree.py from its own directory.

Three processes, all trusted until the last one runs the code:

  supervisor  reads the request (code + the io-pair INPUTS; the expected outputs never enter the sandbox, so the
              code cannot read or forge them), keeps stdout as the result channel, points fds 0/1/2 at
              /dev/null, becomes a child subreaper (every orphan below it is re-parented to it), makes a PID
              namespace when it can (root; bubblewrap already made one) and forks. When its child ends it
              kills every process left below it (proctree) and exits with the worker's status (128 + signal
              when the worker was killed). Under bwrap it simply exits: bwrap's init follows and the kernel
              kills the namespace.
  init        (own PID namespace only) pid 1 of the namespace: forks the worker, reaps everything, and exits
              with the worker; the kernel then SIGKILLs every other process in the namespace.
  worker      set-up, then the untrusted code:
    1. mode "namespaces" (root): new network, mount, IPC and UTS namespaces; a tmpfs mounted over the working
       directory becomes the new root, holding only a read-only bind of the Python installation and an empty,
       size-capped /work; chroot into it; uid/gid `nobody`, no supplementary groups (no capability left);
       mode "bwrap": bubblewrap made the namespaces; an inode-capped tmpfs over /work, uid nobody, no
       capability (see sandbox.py); mode "landlock": no namespaces but the PID one; as root, no capability;
    2. no_new_privs, then Landlock where the kernel has it (read-only: the Python installation, /usr/lib(64)
       under bwrap; read-write: /work or the working directory; TCP refused; signals and abstract unix sockets
       scoped to the sandbox);
    3. seccomp: fork, vfork, clone, clone3 refused (no process, no thread; with "threads", clone of a thread
       allowed), x32 and foreign-arch calls killed;
    4. resource limits: CPU seconds, address space, no new processes, file size, open files, no core;
    5. one status line to the parent ("ready" + which layers are active) before the untrusted code runs, so the
       untrusted code cannot fake a set-up failure.
    Then the code is exec'd, `f(x)` is called on each input, and one JSON line with the outputs follows. The
    parent reads it strictly and compares it with the expected outputs; it never trusts anything else this
    process says. The set-up uses ctypes, which stays loaded: the untrusted code can import it and call libc.
PR_SET_PDEATHSIG ties init and worker to their parents. The switches "pidns", "no_fork" and "nproc" in the
limits exist for the tests that show each layer holds on its own.
"""
import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x04000000, 0x08000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_SECCOMP = 38, 1, 36, 22
CLONE_NEWPID, CLONE_THREAD = 0x20000000, 0x00010000
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
NOBODY = 65534
DEV_NULL = "/dev/null"
USR_LIBS = ("/usr/lib", "/usr/lib64")   # the shared libraries libraries link (import_dirs only; bubblewrap: always)

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def enter_namespaces_and_jail(jail, python_prefix, tmpfs_bytes, imports=()):
    """New net/mount/ipc/uts namespaces, a tmpfs root with the Python installation (and each of `imports`, the
    [outside, inside] pairs of import_dirs, at its inside path) read-only, chroot."""
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount is seen outside, and vice versa
    mount("tmpfs", jail, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},nr_inodes=4096,mode=0755")
    for outside, where in [(python_prefix, python_prefix), *imports]:
        inside = jail + where
        os.makedirs(inside, mode=0o755)
        mount(outside, inside, None, MS_BIND | MS_REC)
        mount(None, inside, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if imports:     # libraries: the shared libraries they link (as bubblewrap binds them), and os.devnull, which
        # dill opens at import: the one device, bound from the host
        for lib in [d for d in USR_LIBS if os.path.isdir(d)]:
            os.makedirs(jail + lib, mode=0o755)
            mount(lib, jail + lib, None, MS_BIND | MS_REC)
            mount(None, jail + lib, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        for link in ("/lib", "/lib64"):
            if os.path.islink(link):
                os.symlink(os.readlink(link), jail + link)
        os.makedirs(jail + "/dev", mode=0o755)
        open(jail + DEV_NULL, "w").close()
        mount(DEV_NULL, jail + DEV_NULL, None, MS_BIND)
    os.mkdir(jail + "/work", 0o700)
    os.chown(jail + "/work", NOBODY, NOBODY)
    os.chroot(jail)
    os.chdir("/work")
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)  # from root to non-root: the kernel clears all capabilities


def drop_capabilities():
    """Empty the effective, permitted and inheritable sets (and so the ambient set) of this process."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    check(libc.capset(header, data), "capset")
    check(libc.capget(header, data), "capget")
    if any(data):
        raise RuntimeError("capabilities still held after capset")


def bwrap_work(tmpfs_bytes):
    """Inside bubblewrap: replace its /work tmpfs (whose number of files bwrap cannot bound) by one with an inode
    cap, with the CAP_SYS_ADMIN sandbox.py granted (run as root: no user namespace, so uid nobody below is the
    real, host uid, which RLIMIT_NPROC counts), then become uid nobody and drop every capability. Not root,
    bubblewrap maps uid nobody in a user namespace and grants nothing: the mount fails and the number of files
    is then bounded by time only. Returns the layers applied."""
    mounted = libc.mount(b"tmpfs", b"/work", b"tmpfs", MS_NOSUID | MS_NODEV,
                         f"size={tmpfs_bytes},nr_inodes=4096,mode=0700,uid={NOBODY},gid={NOBODY}".encode()) == 0
    if os.getuid() == 0:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)  # from root to non-root: the kernel clears all capabilities
    drop_capabilities()
    os.chdir("/work")
    return (["work-tmpfs-inode-cap"] if mounted else []) + ["uid-nobody", "no-capabilities"]


def landlock(read_only, read_write, files=()):
    """Allow read on `read_only`, read/write on `read_write` and on the files `files` (/dev/null), nothing else on
    any filesystem; refuse TCP bind/connect (ABI >= 4); scope signals and abstract unix sockets to this sandbox
    (ABI >= 6). Returns the list of layers applied ([] when the kernel has no Landlock)."""
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

    read_write_file = (1 << 1) | (1 << 2) | (1 << 14 if abi >= 3 else 0)     # WRITE_FILE | READ_FILE | TRUNCATE
    for path, access in [(p, read) for p in read_only] + [(p, write) for p in read_write] + \
            [(p, read_write_file) for p in files]:
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


def no_fork_filter(threads=False):
    """seccomp (x86_64): fork, vfork and clone fail with EPERM, clone3 with ENOSYS (glibc then tries clone), so
    no process or thread can be created, even by root (which RLIMIT_NPROC does not stop, nor does it stop a uid
    that bubblewrap's user namespace maps to root outside); other architectures and x32 calls are killed.
    threads=True lets clone make a thread (CLONE_THREAD in its flags: a task that shares this process's memory,
    signal handlers and thread group, never a new process); every other clone still fails. Returns the layers
    applied."""
    if os.uname().machine != "x86_64":
        return []
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, errno_, kill = 0x7FFF0000, 0x00050000, 0x80000000
    head = [(ld, 0, 0, 4), (jeq, 1, 0, 0xC000003E), (ret, 0, 0, kill),           # arch must be x86_64
            (ld, 0, 0, 0), (jge, 0, 1, 0x40000000), (ret, 0, 0, kill),           # no x32 system calls
            (jeq, 0, 1, 435), (ret, 0, 0, errno_ | 38)]                           # clone3: ENOSYS
    if threads:
        program = head + [(jeq, 5, 0, 57), (jeq, 4, 0, 58),                      # fork, vfork: EPERM
                          (jeq, 0, 2, 56), (ld, 0, 0, 16),                        # clone: its flags (args[0])
                          (jset, 0, 1, CLONE_THREAD),                             # a thread: allowed
                          (ret, 0, 0, allow), (ret, 0, 0, errno_ | 1)]            # ... else EPERM
    else:
        program = head + [(jeq, 3, 0, 56), (jeq, 2, 0, 57), (jeq, 1, 0, 58),      # clone, fork, vfork
                          (ret, 0, 0, allow), (ret, 0, 0, errno_ | 1)]            # ... EPERM

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*[Filter(*op) for op in program])
    prog = Program(len(program), filters)
    check(libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(prog), 0, 0), "prctl(SECCOMP)")
    return ["seccomp-threads-only" if threads else "seccomp-nofork"]


def set_limits(lim):
    cpu = lim["cpu_s"]
    for res, value in [(resource.RLIMIT_CPU, (cpu, cpu + 1)),  # soft: SIGXCPU (catchable); hard: SIGKILL
                       (resource.RLIMIT_AS, (lim["memory_bytes"],) * 2),
                       # no fork, no threads (ignored for root); "threads": N tasks of this uid (seccomp: threads only)
                       (resource.RLIMIT_NPROC, (lim.get("threads") or lim.get("nproc", 0),) * 2),
                       (resource.RLIMIT_FSIZE, (lim["fsize_bytes"],) * 2),
                       (resource.RLIMIT_NOFILE, (lim["nofile"],) * 2),
                       (resource.RLIMIT_CORE, (0, 0))]:
        resource.setrlimit(res, value)


def set_up(req):
    """Everything in the worker before the untrusted code. Returns the isolation report; raises on any failure."""
    mode, layers = req["mode"], []
    python_prefix = os.path.realpath(sys.base_prefix)
    imports = [tuple(pair) for pair in req.get("imports", [])]
    if mode == "namespaces":
        enter_namespaces_and_jail(os.getcwd(), python_prefix, req["limits"]["tmpfs_bytes"], imports)
        layers += ["netns", "mountns+chroot", "ipcns", "utsns", "uid-nobody"]
        work, read_only = "/work", [python_prefix]
    elif mode == "bwrap":  # bubblewrap made the namespaces; check the two we rely on most
        if os.getpid() > 16:
            raise RuntimeError(f"bwrap did not isolate: pid {os.getpid()}")
        layers += ["bwrap", "pidns", "netns", "mountns", "ipcns", "utsns"]
        layers += bwrap_work(req["limits"]["tmpfs_bytes"])
        if os.getuid() != NOBODY:
            raise RuntimeError(f"bwrap did not isolate: uid {os.getuid()}")
        work, read_only = "/work", [python_prefix] + [d for d in ("/usr/lib", "/usr/lib64") if os.path.isdir(d)]
    else:
        work, read_only = os.getcwd(), [python_prefix]
    read_only += [inside for _, inside in imports]
    if imports and mode != "bwrap":   # under bwrap already there; Landlock alone: the host's, by their real paths
        read_only += sorted({os.path.realpath(d) for d in (*USR_LIBS, "/lib", "/lib64") if os.path.isdir(d)}
                            - set(read_only))
    sys.path += [inside for _, inside in imports]     # the code imports from them (read-only, no .pth files run)
    layers += ["import-dirs"] if imports else []
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    layers += landlock(read_only, [work], [DEV_NULL] if imports and os.path.exists(DEV_NULL) else [])
    if req["limits"].get("no_fork", True):
        layers += no_fork_filter(threads=bool(req["limits"].get("threads")))
    network = "netns" if "netns" in layers else "landlock-tcp" if "landlock-tcp" in layers else None
    if network is None:
        raise RuntimeError("no network isolation available: need root (network namespace) or Landlock ABI >= 4")
    if mode == "landlock" and "landlock-fs" not in layers:
        raise RuntimeError("no filesystem isolation available: need root (mount namespace) or Landlock")
    set_limits(req["limits"])
    layers += ["rlimits"]
    if mode == "landlock" and os.geteuid() == 0:  # run as root: keep uid 0 (files) but no capability at all
        drop_capabilities()
        layers += ["no-capabilities"]
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


def exit_code(status):
    """A wait status as one exit code: the code itself, or 128 + the signal that killed the process."""
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def die_with_parent(parent):
    """SIGKILL this process when its parent dies (checked once more after arming: the parent may be gone; in a
    new PID namespace the parent outside it reads as 0, and then sandbox.py's kill of the tree is the net)."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if os.getppid() not in (parent, 0):
        os._exit(1)


def wait_for(child):
    """Reap every child until `child` ends; returns its exit code (1 if it was never seen)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        if pid == child:
            return exit_code(status)


def worker(req, result_fd):
    """The process that runs the untrusted code: set-up, status line, code, result line."""
    try:
        os.setsid()  # its own session and process group: kill(0, ...) reaches nothing but itself and below
        isolation = set_up(req)
        isolation.update(req["isolation"])
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


def load_proctree():
    """harness/proctree.py, next to this file (`python -I` does not put this directory on sys.path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("proctree", os.path.join(os.path.dirname(__file__), "proctree.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def follow_the_harness(parent, proctree):
    """If the harness dies (even SIGKILLed), kill everything below us and go: the kernel sends us SIGTERM
    (PR_SET_PDEATHSIG), which this trusted process handles. The worker cannot send it (Landlock scopes its
    signals; in the namespaces mode it is another uid, in another PID namespace)."""
    def on_parent_death(signum, frame):
        proctree.kill_tree(os.getpid())
        os._exit(128 + signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_parent_death)
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0), "prctl(PDEATHSIG)")
    if os.getppid() != parent:  # the harness was already gone
        on_parent_death(None, None)


def supervisor(req, result_fd):
    """The trusted top of the sandbox. A child subreaper: every orphan below it is re-parented to it, so when the
    worker ends it can find and kill whatever the worker left (fork + setsid included). With a PID namespace
    (root; bubblewrap makes its own) the worker runs under a trusted init, pid 1, which reaps and, by exiting,
    makes the kernel kill every process in the namespace."""
    proctree = load_proctree()
    check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
    req["isolation"] = {"backend": "bwrap" if req["mode"] == "bwrap" else "jail",
                        "pidns": req["mode"] == "bwrap", "subreaper": True}
    if req["mode"] != "bwrap" and req["limits"].get("pidns", True):
        req["isolation"]["pidns"] = libc.unshare(CLONE_NEWPID) == 0  # EPERM when not root: subreaper only
    me, child = os.getpid(), os.fork()
    if child and req["mode"] == "bwrap":
        drop_capabilities()  # only the worker needed one, for its /work mount
    elif child:
        follow_the_harness(req.get("parent"), proctree)
    if child == 0:
        die_with_parent(me)
        if not req["isolation"]["pidns"]:
            worker(req, result_fd)
        init, grandchild = os.getpid(), os.fork()  # we are pid 1 of the new namespace
        if grandchild == 0:
            die_with_parent(init)
            worker(req, result_fd)
        os.close(result_fd)
        os._exit(wait_for(grandchild))
    os.close(result_fd)
    code = wait_for(child)
    if req["mode"] == "bwrap":  # bwrap's own init exits with us, and the kernel kills the namespace
        os._exit(code)
    proctree.kill_tree(me)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    os._exit(code)


def main():
    req = json.loads(sys.stdin.buffer.read())
    result_fd = os.dup(1)
    null_fd = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null_fd, fd)
    os.close(null_fd)
    try:
        if req["mode"] == "auto":
            req["mode"] = "namespaces" if os.geteuid() == 0 else "landlock"
        if req["mode"] not in ("namespaces", "landlock", "bwrap"):
            raise ValueError(f"unknown sandbox mode {req['mode']!r} (auto, namespaces, landlock, bwrap)")
        supervisor(req, result_fd)
    except BaseException as e:  # noqa: BLE001
        os.write(result_fd, (json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n").encode())
        os._exit(3)


if __name__ == "__main__":
    main()
