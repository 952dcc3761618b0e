"""Can this machine reproduce the kernels a run's scores came from? The facts a run records about the machine it ran
on (lm-eval's results `pretty_env_info`, run.py's environment.json) against this machine's, in words a reader
understands.

Why it matters: a float is a function of the input tensors *and* the kernels that combined them. The same tensors on
another CPU (another vendor, instruction set or model: MKL and oneDNN dispatch on all three), another torch build or
another thread count (a matrix split another way is summed in another order) give other floats; measured in
docs/forward-dtypes.md. So the forward level expects bit-for-bit equality only where the run's record says it ran on
a CPU of this machine's kind (vendor, family, model, model name and the full flags line), the same torch build, on
the cpu, and this audit runs at default kernels (no MKL_ENABLE_INSTRUCTIONS, ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA
... of its own). lm-eval does not record torch's thread count: it is torch's default, one per physical core of the
run's machine, read from its lscpu lines (`default_threads`); a run made with OMP_NUM_THREADS set records nothing of
it. The caller tries the candidate counts and says which it used.

Limits: the flags line a run records is the hardware's; a run made under a kernel-restricting variable records no
trace of it. Reading /proc/cpuinfo: Linux only; elsewhere this machine's CPU is unknown and equality is not claimed.
Standard library only (no torch: the torch version is read from the installed package's metadata).
"""
import os
import re
from importlib.metadata import PackageNotFoundError, version

MAX_ENV_INFO = 200_000       # characters of pretty_env_info read
MAX_CPUINFO = 4 * 2 ** 20    # bytes of /proc/cpuinfo read
# Variables that change which kernels run (their presence, whatever the value, leaves the default kernels).
KERNEL_VARS = ("MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE", "ATEN_CPU_CAPABILITY",
               "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE",
               "TORCH_MKLDNN_MATMUL_MIN_DIM")
# What an AVX2-only run of this machine's kind of CPU ran (a virtual machine that hides AVX-512 from its guest): the
# libraries held to AVX2 in a child process (the variables are read when torch loads).
AVX2_ONLY = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
WIDER_THAN_AVX2 = ("avx512", "amx", "avx_vnni")     # flag prefixes a CPU without AVX-512 lacks


class CPU:
    """One machine's CPU as far as kernel dispatch goes: vendor, family, model, model name, flags, physical cores;
    plus the torch build (`torch`) and the device the scores came from."""

    def __init__(self, vendor=None, family=None, model=None, name=None, flags=frozenset(), cores=None, torch=None,
                 device="cpu"):
        self.vendor, self.family, self.model, self.name = vendor, family, model, name
        self.flags, self.cores, self.torch, self.device = frozenset(flags), cores, torch, device

    def isa(self):
        """The widest vector instruction set the flags name, as a reader knows them."""
        f = self.flags
        if {"avx512f", "avx512bw", "avx512vl"} <= f:
            return "AVX-512" + (" with AVX-512 BF16" if "avx512_bf16" in f else "") + \
                (" and AMX" if "amx_tile" in f else "")
        if {"avx2", "fma"} <= f:
            return "AVX2 (no AVX-512)"
        if "avx" in f:
            return "AVX (no AVX2)"
        return "no AVX" if f else "unrecorded instruction sets"

    def describe(self):
        return f"{self.name or 'an unnamed CPU'} ({self.vendor or 'vendor unrecorded'}, {self.isa()})"


def _field(text, label):
    m = re.search(rf"^{re.escape(label)}:[ \t]*(.*)$", text, re.MULTILINE)
    return m.group(1).strip() if m else None


def _int(value):
    return int(value) if isinstance(value, str) and value.isdigit() and len(value) < 9 else None


def from_pretty_env_info(text):
    """The run's CPU from lm-eval's pretty_env_info (torch's collect_env text with lscpu's lines), or None when it
    is absent or names no CPU."""
    if not isinstance(text, str) or not text:
        return None
    text = text[:MAX_ENV_INFO]
    name, flags = _field(text, "Model name"), _field(text, "Flags")
    if name is None and flags is None:
        return None
    sockets, per_socket = _int(_field(text, "Socket(s)")), _int(_field(text, "Core(s) per socket"))
    torch = _field(text, "PyTorch version")
    cuda = _field(text, "Is CUDA available")
    return CPU(vendor=_field(text, "Vendor ID"), family=_int(_field(text, "CPU family")),
               model=_int(_field(text, "Model")), name=name, flags=(flags or "").split(),
               cores=sockets * per_socket if sockets and per_socket else None,
               torch=torch if torch and torch != "N/A" else None, device="cuda" if cuda == "True" else "cpu")


def this_machine():
    """This machine's CPU from /proc/cpuinfo (None where it cannot be read) and the installed torch's version."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            text = f.read(MAX_CPUINFO).decode("utf-8", "replace")
    except OSError:
        return None
    blocks = [dict(re.findall(r"^([^:\n]+?)\s*:\s*(.*)$", b, re.MULTILINE)) for b in text.split("\n\n") if b.strip()]
    cores = {(b.get("physical id"), b.get("core id")) for b in blocks if "core id" in b}
    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = None
    first = blocks[0] if blocks else {}
    return CPU(vendor=first.get("vendor_id"), family=_int(first.get("cpu family")), model=_int(first.get("model")),
               name=first.get("model name"), flags=first.get("flags", "").split(), cores=len(cores) or os.cpu_count(),
               torch=torch)


def kernel_settings(environ=None):
    """{variable: value} of the kernel-changing variables set in this process's environment."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in KERNEL_VARS if environ.get(k)}


def default_threads(run):
    """torch's default intra-op thread count on the run's machine: one per physical core (sockets x cores per
    socket, lscpu's lines), or None when unrecorded."""
    return run.cores if run is not None else None


def same_kind(run, here):
    """Whether `run` and `here` name the same kind of CPU (vendor, family, model, model name) and torch build."""
    return run.torch == here.torch and \
        (run.vendor, run.family, run.model, run.name) == (here.vendor, here.family, here.model, here.name)


def restriction(run, here):
    """The variables (AVX2_ONLY) under which this machine runs the kernels of `run`, a CPU of this machine's kind
    (vendor, family, model, model name, torch build) whose flags are this machine's less the AVX-512 family, or None.
    A claim read from the libraries' dispatch (they choose by instruction set), measured here only on runs made under
    the same variables; an AVX2-only machine of this kind was not available to measure."""
    if run is None or here is None or run.device != "cpu" or not same_kind(run, here):
        return None
    extra = here.flags - run.flags
    if not extra or not run.flags < here.flags or not {"avx2", "fma"} <= run.flags:
        return None
    return dict(AVX2_ONLY) if all(f.startswith(WIDER_THAN_AVX2) for f in extra) else None


def reproduces(run, here, device="cpu", environ=None):
    """(True, what matches) when this machine runs the kernels the run's record names; else (False, why not), in
    words a reader understands. `run` and `here` are CPU objects (or None: unrecorded / unreadable)."""
    if run is None:
        return False, ("the run records no CPU (no pretty_env_info with lscpu's lines): whether this machine's kernels "
                       "are the run's is unknown")
    if run.device != "cpu" or device.split(":")[0] != "cpu":
        return False, f"the run's scores came from {run.device}, this audit runs on {device}"
    if here is None:
        return False, "this machine's CPU cannot be read (/proc/cpuinfo): whether its kernels are the run's is unknown"
    if run.torch != here.torch:
        return False, f"the run used torch {run.torch}, this audit torch {here.torch}: other kernels"
    mine, theirs = here.describe(), run.describe()
    if (run.vendor, run.family, run.model, run.name) != (here.vendor, here.family, here.model, here.name):
        return False, (f"the run was made on {theirs}, this machine is {mine}: another CPU's kernels are not "
                       "reproduced here")
    settings = kernel_settings(environ)
    if run.flags != here.flags and restriction(run, here) is not None and not settings:
        return True, (f"the run was made on this machine's kind of CPU without AVX-512, {theirs}, with torch "
                      f"{here.torch}: re-scored in a child process held to AVX2 (" +
                      " ".join(f"{k}={v}" for k, v in AVX2_ONLY.items()) + ")")
    if run.flags != here.flags:
        missing, extra = sorted(run.flags - here.flags), sorted(here.flags - run.flags)
        return False, (f"the run was made on {theirs}, this machine is {mine} with other CPU flags (the run's has "
                       f"{', '.join(missing[:6]) or 'none'} that this one lacks; this one has "
                       f"{', '.join(extra[:6]) or 'none'} that the run's lacks): the kernels may differ")
    if settings:
        return False, ("this audit runs with " + ", ".join(f"{k}={v}" for k, v in sorted(settings.items())) +
                       ", not the default kernels the run's record implies")
    return True, f"the run was made on this machine's kind of CPU, {mine}, with torch {here.torch}"
