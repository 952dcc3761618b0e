"""Find and kill every descendant of a process, from /proc (Linux). Used twice by the code sandbox: by the
supervisor inside jail.py (a PR_SET_CHILD_SUBREAPER, so orphans of the untrusted code are re-parented to it and
stay findable) when the untrusted process ends, and by sandbox.py on the supervisor's tree before it kills and
reaps the supervisor itself (timeouts). Standard library only: jail.py loads this file in a bare interpreter.

`kill_tree` first freezes the whole tree with SIGSTOP (repeating the walk until no new process appears: a stopped
process cannot fork, and a parent that is not dead re-parents nobody), then SIGKILLs every process found, again
until none is left. A process id read from /proc can in principle be reused between the read and the kill; the
processes here are not reaped by anyone but their (frozen) parents, so their ids stay taken while we act.
"""
import os
import signal
import time


def parents():
    """{pid: ppid} of every process visible in /proc ({} when /proc is not mounted)."""
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # the command name may hold spaces and ')'
        if len(fields) > 1:
            out[int(name)] = int(fields[1])
    return out


def descendants(root):
    """Every process below `root` (children, grandchildren, ...), in walk order."""
    children = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(root, rounds=200):
    """SIGSTOP, then SIGKILL, every descendant of `root` (not `root` itself). Returns how many were found."""
    seen = set()
    for _ in range(rounds):  # freeze: until a walk finds nothing new
        found = set(descendants(root)) - seen
        if not found:
            break
        _signal_all(found, signal.SIGSTOP)
        seen |= found
    for _ in range(rounds):  # kill: until nothing is left below root (zombies are reaped by their parents)
        alive = [p for p in descendants(root) if not _zombie(p)]
        if not alive:
            break
        seen |= set(alive)
        _signal_all(alive, signal.SIGKILL)
        time.sleep(0.002)  # let the kernel finish the exits
    return len(seen)


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")
