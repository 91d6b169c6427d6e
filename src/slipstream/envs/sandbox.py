"""The built-in `python` tool: run model-written code in a separate, limited process.

What bounds a run (`SandboxLimits`):

- a wall-time limit, and nothing the code started outlives the call: the interpreter is a
  supervisor that forks the process running the code and, on Linux, is a child subreaper
  (`PR_SET_CHILD_SUBREAPER`), so whatever the code starts and leaves behind reparents to it,
  also from a session of its own (`setsid()`, a double fork). When the code exits, at
  `wall_s` (the caller SIGTERMs the supervisor), or when the process running the call dies
  (an environment worker killed for its step's time limit; the supervisor's parent-death
  signal, Linux), it SIGKILLs and reaps its children until none is left, the code's process
  first; in the last case it also removes the call's working directory. The caller then
  SIGKILLs the process group as a backstop (the code may kill its supervisor: what it moved
  to another session is then out of reach);
- rlimits set in the child before it starts: CPU seconds (`RLIMIT_CPU`), address space
  (`RLIMIT_AS`, so a memory hog gets MemoryError), processes (`RLIMIT_NPROC`, which counts
  every thread of the user: the user's threads now plus `max_procs` and `NPROC_SLACK` for the
  threads the caller or the code's libraries start, so a fork bomb's forks fail), file size
  (`RLIMIT_FSIZE`), no core.
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
  path outside it (resolved, so a symlink does not get around it), `/dev/null` apart;
- its output (stdout and stderr together) cut to `max_output_chars`.

The code sees the standard library only: the interpreter runs with `-S`, so its site-packages
(numpy and the like) do not import; `SandboxLimits(site_packages=True)` drops `-S` (the
interpreter is this process's, `sys.executable`: its virtual environment's packages import).

This is isolation against accidents of model-written code (loops, hogs, stray writes, stray
daemons), NOT a security boundary against a determined attacker: audit hooks can be bypassed
from Python (ctypes) and see Python's own calls only (a program the code starts, a shell's
`echo x > /tmp/y`, writes where your user can, and reaches the network where `unshare` does not
work; `os.mknod` and `sqlite3` write outside too), the code can kill its supervisor (it runs as the same user), there is no
filesystem or syscall isolation beyond rlimits and the network namespace, and the code runs as
your user and reads what you can. For untrusted code at scale, plug a
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

# Runs first, in the interpreter the caller starts: the supervisor of the module docstring.
# `_supervise()` returns only in the forked process that runs the code (`_BOOT`, after it);
# the supervisor itself waits, sweeps and exits with the code's status. PARENT: the caller.
_SUPERVISE = r"""
import os, signal, time
class _Stop(Exception):
    pass
def _stop(signum, frame):
    raise _Stop
def _children():
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: scan /proc
        pass
    kids = []
    for d in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                    kids.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return kids
def _sweep(first):
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        for pid in [*first, *_children()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        time.sleep(0.002)
def _exit_as(status):
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(1 if status is None else os.WEXITSTATUS(status))
def _supervise():
    status = None
    signal.signal(signal.SIGTERM, _stop)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    code = os.fork()
    if code == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        return
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        while status is None:
            pid, st = os.waitpid(-1, 0)
            status = st if pid == code else None
    except _Stop:  # the wall limit, or the caller died (its parent-death signal)
        pass
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    _sweep([] if status is not None else [code])  # (a reaped pid may be another's now)
    if os.getppid() != PARENT:  # nobody else is left to remove the working directory
        import shutil
        shutil.rmtree(os.getcwd(), ignore_errors=True)
    _exit_as(status)
_supervise()
"""

# Runs in the process that runs the code, before the code: the audit hook of the docstring.
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
    return p != _root and not p.startswith(_root + os.sep) and p != os.devnull
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
import runpy
sys.addaudithook(_hook)
del _hook
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")  # as `python main.py`: pickle finds its classes
"""

Network = Literal["auto", "unshare", "audit"]
NPROC_SLACK = 64  # threads beyond max_procs: the caller's new ones, the code's libraries'
STOP_S = 2.0  # how long a supervisor SIGTERMed at the wall limit has to sweep and exit


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


def _user_tasks(uid: int) -> int:
    """Threads of `uid`'s processes: what RLIMIT_NPROC counts on Linux (every task of the
    real user, not processes; a trainer's process alone holds dozens)."""
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if d.stat().st_uid == uid:
                    n += len(os.listdir(d / "task"))
            except OSError:  # (it exited meanwhile)
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
        if prctl is not None:  # SIGTERMed if the process running it dies (PR_SET_PDEATHSIG):
            prctl(1, signal.SIGTERM)  # the supervisor then kills what the code started
            prctl(36, 1)  # PR_SET_CHILD_SUBREAPER (kept across exec): orphans reparent to it
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
    boot = f"MAX_PROCS = {lim.max_procs}\nPARENT = {os.getpid()}\n{_SUPERVISE}{_BOOT}"
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
    # the user's threads now, the supervisor, the code's processes, and room for threads (a
    # fork or a thread fails once the user's tasks reach the limit)
    nproc = _user_tasks(uid) + 1 + lim.max_procs + NPROC_SLACK
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
        proc.terminate()  # the supervisor kills the code and all it started, then exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_S)
    with contextlib.suppress(ProcessLookupError):  # the backstop (module docstring)
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
