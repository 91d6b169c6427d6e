"""The built-in `python` tool: run model-written code in a separate, limited process.

What bounds a run (`SandboxLimits`):

- a wall-time limit: the process group is SIGKILLed at `wall_s` (and always at the end, so
  children it forked do not outlive it); the process is SIGKILLed too if the one running it
  dies first (an environment worker killed for its step's time limit; Linux);
- rlimits set in the child before it starts: CPU seconds (`RLIMIT_CPU`), address space
  (`RLIMIT_AS`, so a memory hog gets MemoryError), processes (`RLIMIT_NPROC`: those its user
  runs now plus `max_procs`, so a fork bomb's forks fail), file size (`RLIMIT_FSIZE`), no core.
  The kernel does not apply `RLIMIT_NPROC` to root, so the audit hook below also caps the
  processes the code starts (`os.fork`, `subprocess`, `os.system`, `posix_spawn`) at
  `max_procs` in all; `SandboxLimits.uid` runs the code as another (non-root) user, for whom the
  kernel limit holds and whose file permissions apply (that user must be able to run the
  interpreter);
- no network: when `unshare -rn` works (unprivileged user and network namespaces, Linux), the
  code runs in a namespace whose only interface is a down loopback. Otherwise, and in any case,
  a Python audit hook (PEP 578) refuses `socket.connect`, `bind`, `sendto` and name lookups;
- writes only in its own temporary working directory, which is removed afterwards: the audit
  hook refuses opening for writing, creating, renaming, removing or changing the mode of a
  path outside it (resolved, so a symlink does not get around it);
- its output (stdout and stderr together) cut to `max_output_chars`.

The code sees the standard library only: the interpreter runs with `-S`, so its site-packages
(numpy and the like) do not import; `SandboxLimits(site_packages=True)` drops `-S` (the
interpreter is this process's, `sys.executable`: its virtual environment's packages import).

This is isolation against accidents of model-written code (loops, hogs, stray writes), NOT a
security boundary against a determined attacker: audit hooks can be bypassed from Python
(ctypes), there is no filesystem or syscall isolation beyond rlimits and the network namespace,
and the code runs as your user and reads what you can. For untrusted code at scale, plug a
stronger sandbox (gVisor, Firecracker, nsjail, a container per call) in as your own tool with
the same shape: a method `python(code: str) -> str` on a tool class.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import BinaryIO, Literal

from slipstream.envs.tools import ToolReply

# Runs in the child before the user's code: the audit hook of the module docstring.
_BOOT = r"""
import os, sys
_root = os.path.realpath(os.getcwd())
_W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATHS = {"os.remove": 1, "os.rename": 2, "os.replace": 2, "os.mkdir": 1, "os.rmdir": 1,
          "os.symlink": 2, "os.link": 2, "os.chmod": 1, "os.chown": 1, "os.truncate": 1,
          "os.utime": 1, "shutil.rmtree": 1, "shutil.copyfile": 2, "shutil.move": 2}
_SPAWN = {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen"}
_forks = os.open(".forks", os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # shared by the whole tree
_NET = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
        "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"}
def _outside(p):
    if isinstance(p, int) or p is None:
        return False
    p = os.path.realpath(os.fsdecode(p))
    return p != _root and not p.startswith(_root + os.sep)
def _hook(event, args):
    if event == "open":
        if args[2] & _W and _outside(args[0]):
            raise PermissionError(f"sandbox: no writing outside the working directory: {args[0]}")
    elif event in _PATHS:
        for p in args[: _PATHS[event]]:
            if (event not in ("os.symlink", "shutil.copyfile") or p is args[1]) and _outside(p):
                raise PermissionError(f"sandbox: no changes outside the working directory: {p}")
    elif event in _NET:
        raise PermissionError("sandbox: no network")
    elif event in _SPAWN:
        os.write(_forks, b"x")
        if os.fstat(_forks).st_size > MAX_PROCS:
            raise BlockingIOError(f"sandbox: at most {MAX_PROCS} processes")
_src = open("main.py", encoding="utf-8").read()
sys.addaudithook(_hook)
del _hook
sys.argv = ["main.py"]
exec(compile(_src, "main.py", "exec"), {"__name__": "__main__"})
"""

Network = Literal["auto", "unshare", "audit"]


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run; see the module docstring for what each does. A value out of its
    bounds raises ValueError naming it."""

    wall_s: float = 10.0  # > 0
    cpu_s: int = 10  # >= 1
    memory_mb: int = 512  # >= 1
    max_procs: int = 8  # >= 0 (0: the code starts no process)
    max_file_mb: int = 16  # >= 1 (the output file is one of its files)
    max_output_chars: int = 4000  # >= 0 (0: only the note of how much was cut)
    network: Network = "auto"  # auto: a network namespace if unshare works, else the hook only
    uid: int | None = None  # run as this user (None: as ourselves)
    site_packages: bool = False  # True: the code can import the interpreter's installed
    # packages (numpy, ...); False runs it with `python -S`: the standard library only

    def __post_init__(self) -> None:
        checks = [
            ("wall_s", self.wall_s > 0, "> 0"),
            ("cpu_s", self.cpu_s >= 1, ">= 1"),
            ("memory_mb", self.memory_mb >= 1, ">= 1"),
            ("max_procs", self.max_procs >= 0, ">= 0"),
            ("max_file_mb", self.max_file_mb >= 1, ">= 1"),
            ("max_output_chars", self.max_output_chars >= 0, ">= 0"),
            ("network", self.network in ("auto", "unshare", "audit"), "auto, unshare or audit"),
            ("uid", self.uid is None or self.uid >= 0, ">= 0 or None"),
        ]
        for name, ok, bound in checks:
            if not ok:
                got = getattr(self, name)
                raise ValueError(f"SandboxLimits.{name} must be {bound}, got {got!r}")


@dataclass
class SandboxResult:
    """`error` is "" for a clean exit, else why it failed (`timeout`, `exit 1`, `signal ...`)."""

    output: str
    error: str
    seconds: float
    isolation: str  # "unshare+audit" or "audit": how the network was cut


@cache
def unshare_works() -> bool:
    """Whether `unshare -rn` can make a user + network namespace here (checked once)."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        done = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _user_processes(uid: int) -> int:
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                n += d.stat().st_uid == uid
            except OSError:
                continue
    return n


@cache
def _prctl() -> Callable[..., int] | None:
    """libc's `prctl` (Linux), looked up in the parent: the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return fn


def _limiter(lim: SandboxLimits, nproc: int) -> Callable[[], None]:
    prctl, parent = _prctl(), os.getpid()

    def apply() -> None:
        if prctl is not None:  # SIGKILLed if the process running it dies (PR_SET_PDEATHSIG)
            prctl(1, signal.SIGKILL)
            if os.getppid() != parent:  # it died before that took effect
                os._exit(1)
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_CPU, (lim.cpu_s, lim.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (lim.memory_mb * mb, lim.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim.max_file_mb * mb, lim.max_file_mb * mb))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` under `limits` in a fresh temporary directory (removed afterwards)."""
    lim = limits or SandboxLimits()
    ns = lim.network == "unshare" or (lim.network == "auto" and unshare_works())
    boot = f"MAX_PROCS = {lim.max_procs}\n{_BOOT}"
    site = [] if lim.site_packages else ["-S"]
    cmd = [sys.executable, "-I", *site, "-B", "-X", "utf8", "-c", boot]  # UTF-8 whatever the locale
    if ns:
        cmd = [shutil.which("unshare") or "unshare", "-rn", *cmd]
    work = tempfile.mkdtemp(prefix="slipstream-sandbox-")
    t0 = time.monotonic()
    try:
        Path(work, "main.py").write_text(code, encoding="utf-8")  # (the locale may be ASCII)
        uid = os.getuid() if lim.uid is None else lim.uid
        if uid != os.getuid():
            os.chown(work, uid, uid)
        with open(Path(work, ".output"), "w+b") as out:
            error = _run(cmd, work, out, lim, uid)
            text = _read_cut(out, lim.max_output_chars)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return SandboxResult(text, error, time.monotonic() - t0, "unshare+audit" if ns else "audit")


def _read_cut(out: BinaryIO, n: int) -> str:
    """The output, cut to `n` characters: head and tail (a traceback's end says what failed)."""
    size = out.seek(0, os.SEEK_END)
    out.seek(0)
    if size <= 4 * n:
        text = out.read().decode("utf-8", "replace")
        if len(text) <= n:
            return text
        head, tail, cut = text[: n // 2], text[-(n - n // 2) :], f"{len(text) - n} chars"
    else:  # never read a huge output whole
        head = out.read(2 * n).decode("utf-8", "replace")[: n // 2]
        out.seek(size - 2 * n)
        tail = out.read().decode("utf-8", "replace")[-(n - n // 2) :]
        cut = f"{size - n} bytes"
    return f"{head}\n... [{cut} cut] ...\n{tail}"


def _run(cmd: list[str], work: str, out: BinaryIO, lim: SandboxLimits, uid: int) -> str:
    """Start, wait up to the wall limit, kill the process group; '' or why it failed."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work, "TMPDIR": work}
    nproc = _user_processes(uid) + lim.max_procs
    other = uid != os.getuid()  # run as another user (SandboxLimits.uid)
    proc = subprocess.Popen(
        cmd,
        user=uid if other else None,
        group=uid if other else None,
        extra_groups=[] if other else None,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        preexec_fn=_limiter(lim, nproc),
        start_new_session=True,
    )
    try:
        rc = proc.wait(timeout=lim.wall_s)
        error = "" if rc == 0 else _describe(rc)
    except subprocess.TimeoutExpired:
        error = f"timeout after {lim.wall_s:g} s"
    with contextlib.suppress(ProcessLookupError):  # children that outlive it (a fork bomb's)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return error


def _describe(rc: int) -> str:
    if rc < 0:
        name = signal.Signals(-rc).name
        why = {"SIGXCPU": " (CPU limit)", "SIGXFSZ": " (file size limit)", "SIGKILL": ""}
        return f"killed by {name}{why.get(name, '')}"
    return f"exit {rc}"


class PythonTool:
    """A tool class with one tool, `python`; mix it into yours or use it as is. The code sees
    the standard library only unless `limits.site_packages` (module docstring); the method's
    docstring is the description the model reads: say what it can import in your prompt."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()

    def python(self, code: str) -> ToolReply:
        """Run Python code in a sandbox and return what it printed (stdout and stderr)."""
        r = run_python(code, self.limits)
        if not r.error:
            return ToolReply("python", r.output)
        return ToolReply("python", f"error: {r.error}\n{r.output}".rstrip(), error=True)
