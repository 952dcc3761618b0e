"""run.py's command line as environment.json records it (sys.argv), read again: run.py's flags, written again from
run.parse_args (the audit never imports run.py), which experiments a recorded command ran and the --limit it gave.
A leaf: driver.py (what O must hold) and shared.py (the --limit check every experiment gets) both read it."""
from pathlib import Path

import registry
from evidence_audit.checks import short

# run.py's flags (run.parse_args), written again: those that take a value, and --merge, which takes one or more
RUN_VALUE_FLAGS = ("--cache", "--out", "--experiment", "--split", "--data", "--model", "--device", "--threads",
                   "--dtype", "--limit", "--shard", "--join-timeout", "--sign")
RUN_SWITCHES = ("--smoke", "--no-sort-samples", "--fast", "--no-cache", "--allow-partial-groups", "--replace",
                "--verbose", "--help")
RUN_FLAGS = RUN_VALUE_FLAGS + RUN_SWITCHES + ("--merge",)
MAX_ARGS = 10_000       # a command line is untrusted bytes too


def canonical_flag(arg):
    """The run.py flag `arg` names ("--exp" is argparse's unique prefix of "--experiment"), or None."""
    if arg in RUN_FLAGS:
        return arg
    hits = [f for f in RUN_FLAGS if f.startswith(arg)]
    return hits[0] if len(hits) == 1 else None


def experiments_of_command(argv):
    """(the experiments run.py ran, in run order, or None; why not, or None) for a recorded sys.argv: each
    --experiment (repeatable), or every experiment registry.py declares when none is given. A --merge takes its
    experiments from the shards' own command lines, which O does not hold; a --shard writes no evidence."""
    if not (isinstance(argv, list) and 1 <= len(argv) <= MAX_ARGS and all(isinstance(a, str) for a in argv)):
        return None, f"environment.json command_line: {short(argv, 80)} is not a list of strings"
    if Path(argv[0]).name != "run.py":
        return None, f"environment.json command_line: {short(argv[0], 80)} is not run.py"
    named, merge, k = [], False, 1
    while k < len(argv):
        arg, k = argv[k], k + 1
        flag, eq, value = arg.partition("=")
        flag = canonical_flag(flag) if flag.startswith("--") else None
        if flag is None:
            return None, f"environment.json command_line: {short(arg, 60)} is not a flag run.py takes"
        if flag == "--merge":
            merge = True
            while k < len(argv) and not argv[k].startswith("-"):
                k += 1
        elif flag in RUN_VALUE_FLAGS and not eq:
            if k >= len(argv):
                return None, f"environment.json command_line: {flag} without its value"
            value, k = argv[k], k + 1
        if flag == "--experiment":
            if value not in registry.NAMES:
                return None, f"environment.json command_line: --experiment {short(value, 40)} is not declared"
            named.append(value)
        if flag == "--shard":
            return None, "environment.json command_line: a --shard run writes SHARD.json, not evidence"
    if merge:
        return None, ("a --merge: its experiments come from the shards' command lines, which O does not record "
                      "(only the experiments present were checked against registry.py)")
    return list(dict.fromkeys(named or registry.NAMES)), None


def command_line_limit(env):
    """(N, None) for the --limit N that environment.json's recorded command line gives (argparse: the last one
    wins), (None, None) when it gives none, (None, why) when that cannot be told: no command line, one that is not a
    list of strings, a --merge (its shards' command lines held the flag; O does not record them)."""
    argv = env.get("command_line") if isinstance(env, dict) else None
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return None, "environment.json records no command line (a list of strings) to check the limit against"
    limit, k = None, 1
    while k < len(argv):
        arg, k = argv[k], k + 1
        flag, eq, value = arg.partition("=")
        flag = canonical_flag(flag) if flag.startswith("--") else None
        if flag == "--merge":
            return None, "a --merge: the --limit was on the shards' command lines, which O does not record"
        if flag in RUN_VALUE_FLAGS and not eq:
            if k >= len(argv):
                return None, f"environment.json command_line: {flag} without its value"
            value, k = argv[k], k + 1
        if flag == "--limit":
            try:
                limit = int(value)
            except ValueError:
                return None, f"environment.json command_line: --limit {short(value, 40)} is not an integer"
    return limit, None
