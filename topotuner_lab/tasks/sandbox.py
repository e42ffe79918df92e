"""Running generated code safely: one fresh process per program, with limits, in a temporary folder, offline.

Each program runs as ``python -I main.py`` in a new session inside a fresh temporary folder, with limits on CPU time,
address space, file size and processes, a wall-clock timeout that kills its whole process group, and no network.
Run as root (CI here), the child first leaves the network (a new, empty network namespace) and then drops to the
``nobody`` user, so its process limit binds and it cannot touch files outside its own folder; run as another user, it
gets the limits and a socket-refusing prelude, and :attr:`SandboxResult.isolation` says which applied. The result of
each program is recorded as ``pass``, ``fail`` (an assertion failed), ``timeout`` or ``error``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from topotuner_lab._io.config import POSITIVE, POSITIVE_INT, Config, opt

Status = Literal["pass", "fail", "timeout", "error"]
_CLONE_NEWNET = 0x40000000
_NOBODY = 65534
#: prepended to a program when no network namespace could be made: sockets refuse to open
_NO_SOCKETS = (
    "import socket as _s\n"
    "def _refuse(*a, **k):\n"
    "    raise OSError('network is disabled in the sandbox')\n"
    "_s.socket = _refuse\n_s.create_connection = _refuse\n"
    "del _s, _refuse\n"
)


@dataclass(frozen=True)
class SandboxLimits(Config):
    """What one program may use."""

    label = "sandbox limits"

    timeout_s: float = opt(10.0, "wall-clock seconds before the program's process group is killed", check=POSITIVE)
    cpu_s: int = opt(10, "CPU seconds (RLIMIT_CPU)", check=POSITIVE_INT)
    memory_mb: int = opt(1024, "address space in MiB (RLIMIT_AS)", check=POSITIVE_INT)
    file_mb: int = opt(16, "largest file it may write, MiB (RLIMIT_FSIZE)", check=POSITIVE_INT)
    processes: int = opt(16, "processes it may run at once (RLIMIT_NPROC, as the nobody user)", check=POSITIVE_INT)


@dataclass(frozen=True)
class SandboxResult:
    """How one program ended: status, exit code, the tail of its output, seconds, and the isolation it ran under."""

    status: Status
    returncode: int | None
    output: str
    seconds: float
    isolation: str


def _world_executable(path: str) -> bool:
    """Whether any user may run ``path``: the file and every folder above it are executable by others."""
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & stat.S_IXOTH for p in (real, *real.parents))


def _interpreter() -> tuple[str, bool]:
    """The Python that runs programs, and whether they run as ``nobody``.

    Only root can drop to ``nobody``, and only with an interpreter ``nobody`` can run: this package's own, or the
    system's ``python3`` when ours lies in a private folder.
    """
    if not (hasattr(os, "getuid") and os.getuid() == 0):
        return sys.executable, False
    for candidate in (sys.executable, shutil.which("python3", path="/usr/bin:/bin")):
        if candidate and _world_executable(candidate):
            return candidate, True
    return sys.executable, False


def _child_setup(limits: SandboxLimits, folder: Path, as_nobody: bool) -> None:  # pragma: no cover - runs in the child
    """In the child before ``exec``: leave the network, set the limits, become ``nobody``."""
    import resource

    if as_nobody:
        ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET)
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    memory = limits.memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.file_mb * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if as_nobody:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
        os.setgroups([])
        os.setgid(_NOBODY)
        os.setuid(_NOBODY)
    os.chdir(folder)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_leftovers(folder: Path, started: float, as_nobody: bool) -> None:
    """Kill what outlived the program, and wait until it is gone (zombies reaped).

    That is processes working in ``folder`` or, under ``nobody``, any ``nobody`` process started during the run (one
    that left the session with ``setsid``); waiting gives the next program its whole process budget.
    """
    import psutil

    def leftover(proc: psutil.Process) -> bool:
        cwd = proc.info.get("cwd") or ""
        if cwd == str(folder) or cwd.startswith(f"{folder}/"):
            return True
        uids = proc.info.get("uids")
        return as_nobody and uids is not None and uids.real == _NOBODY and proc.info["create_time"] >= started - 1

    procs = [p for p in psutil.process_iter(["cwd", "uids", "create_time"]) if leftover(p)]
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


def _status(returncode: int | None, output: str, timed_out: bool) -> Status:
    if timed_out or returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"
    if returncode == 0:
        return "pass"
    return "fail" if "AssertionError" in output else "error"


def run_program(source: str, limits: SandboxLimits | None = None, *, keep_output: int = 2000) -> SandboxResult:
    """Run ``source`` as a Python program under :class:`SandboxLimits`; never raises for what the program does."""
    limits = limits or SandboxLimits()
    python, as_nobody = _interpreter()
    parent = Path(tempfile.mkdtemp(prefix="topotuner-sandbox-"))  # root-owned: a program cannot remove its siblings
    parent.chmod(0o755)
    folder = parent / "run"
    folder.mkdir()
    if as_nobody:
        os.chown(folder, _NOBODY, _NOBODY)
    (folder / "main.py").write_text(source if as_nobody else _NO_SOCKETS + source)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "TMPDIR": str(folder), "PYTHONDONTWRITEBYTECODE": "1"}
    log = parent / "output.txt"  # a file, not a pipe: a process that outlives the program cannot hold the run open
    start, started = time.perf_counter(), time.time()
    with open(log, "w") as out:
        process = subprocess.Popen(
            [python, "-I", "main.py"],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: _child_setup(limits, folder, as_nobody),
        )
    timed_out = False
    try:
        process.wait(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(process)  # anything the program left running in its session
        _kill_leftovers(folder, started, as_nobody)  # and anything that left the session
        process.wait()
        output = log.read_text(errors="replace")
        shutil.rmtree(parent, ignore_errors=True)
    return SandboxResult(
        _status(process.returncode, output, timed_out),
        process.returncode,
        output[-keep_output:],
        time.perf_counter() - start,
        "network namespace, nobody user, rlimits" if as_nobody else "rlimits, sockets refused",
    )
