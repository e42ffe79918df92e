"""Running generated code in isolation: one fresh sandbox per program, offline, with limits, leaving nothing behind.

Each program runs under bubblewrap (``bwrap``, Flatpak's sandbox) as ``/usr/bin/python3 -I -``, its source read from
a pipe, in fresh user, PID, mount, network, IPC, UTS and cgroup namespaces: the root it sees is read-only and holds
only ``/usr`` (the system's interpreter and standard library; no project, data, home, ``/tmp`` or other processes),
its folder, home and ``/tmp`` are one private tmpfs of ``disk_mb``, its environment is scrubbed, and it runs as an
unprivileged user (root starts bwrap as ``nobody``). Its limits: CPU seconds, address space and file size per process,
processes in all (counted in its own user namespace), and, where this process may make a cgroup-v1 memory group (root
on hosts with v1 controllers), one memory cap over all its processes and files together. It dies with its caller
(``--die-with-parent``; when a PID namespace's first process dies the kernel kills the rest) or at the wall clock.

A program passes only if it runs to its end and exits with 0: a random token printed after its last line must reach
its output, so an early ``exit()``, ``sys.exit(0)`` or ``os._exit(0)`` fails, as in openai/human-eval. Each program
gets ``pass``, ``fail`` (an assertion failed, or it stopped before its end), ``timeout`` (wall clock or CPU; never
exit code 0) or ``error``. The token is in no file, argument or variable of its environment; a program that searches
its own interpreter's memory for it, or patches its own tests, is beyond what any in-process check can stop.

Where bwrap cannot run, code is refused (:class:`SandboxUnavailableError`) unless ``confirm_run_unsafe_code`` is set
(lm-evaluation-harness's name): then programs run with the rlimits alone, as the caller's user, in a temporary folder,
with the caller's files and network. :attr:`SandboxResult.isolation` says which applied.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from topotuner_lab._io.config import POSITIVE, POSITIVE_INT, Check, Config, opt
from topotuner_lab._io.errors import TopoTunerError

Status = Literal["pass", "fail", "timeout", "error"]
_PYTHON = "/usr/bin/python3"  # the system's: an interpreter whose files all lie under /usr
_PRLIMIT = "/usr/bin/prlimit"  # sets the process limit inside the sandbox's own user namespace
_NOBODY = 65534
_MEMORY_V1 = Path("/sys/fs/cgroup/memory")
#: exit codes of a program killed at a limit: by our kill or the CPU limit, directly or as bwrap reports it (128 + n)
_KILLED = {code for sig in (signal.SIGKILL, signal.SIGXCPU) for code in (-sig, 128 + sig)}
_INSTALL = "install bubblewrap 0.8 or newer (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"


class SandboxUnavailableError(TopoTunerError):
    """Generated code cannot be isolated here and running it unisolated was not confirmed."""


@dataclass(frozen=True)
class SandboxLimits(Config):
    """What one program may use, and whether it may run without isolation."""

    label = "sandbox limits"

    timeout_s: float = opt(10.0, "wall-clock seconds before the program's sandbox is killed", check=POSITIVE)
    cpu_s: int = opt(10, "CPU seconds per process (RLIMIT_CPU)", check=POSITIVE_INT)
    memory_mb: int = opt(
        1024,
        "memory in MiB: address space per process (RLIMIT_AS) and, where a memory cgroup can be made, "
        "all its processes and files together",
        check=POSITIVE_INT,
    )
    file_mb: int = opt(16, "largest file it may write, MiB (RLIMIT_FSIZE; also caps its output)", check=POSITIVE_INT)
    disk_mb: int = opt(64, "MiB all its files may take: the size of its private tmpfs folder", check=POSITIVE_INT)
    processes: int = opt(
        16, "processes it may run at once, itself included (RLIMIT_NPROC in its user namespace)", check=POSITIVE_INT
    )
    confirm_run_unsafe_code: bool = opt(
        False,
        "where bubblewrap cannot run, run programs anyway with rlimits only: they can read, write and send "
        "whatever your user can",
        check=Check(lambda v: isinstance(v, bool), "True or False"),
    )


@dataclass(frozen=True)
class SandboxResult:
    """How one program ended: status, exit code, the tail of its output, seconds, and the isolation it ran under."""

    status: Status
    returncode: int | None
    output: str
    seconds: float
    isolation: str


def _bwrap_command(bwrap: str, limits: SandboxLimits) -> list[str]:
    """The command that runs a program read from stdin in a fresh sandbox."""
    return [
        bwrap,
        *("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"),
        *("--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin"),
        *("--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64"),
        *("--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"),
        *("--size", str(limits.disk_mb * 2**20), "--tmpfs", "/work", "--symlink", "/work", "/tmp", "--chdir", "/work"),
        *("--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8"),
        *("--setenv", "HOME", "/work", "--setenv", "TMPDIR", "/work", "--uid", str(_NOBODY), "--gid", str(_NOBODY)),
        _PRLIMIT,
        f"--nproc={limits.processes + 1}",  # + bwrap's own first process of the namespace
        "--",
        *(_PYTHON, "-I", "-"),
    ]


def _as_root() -> bool:
    return os.getuid() == 0


@functools.cache
def isolation_problem() -> str | None:
    """Why programs cannot be isolated here (None when they can): bwrap is tried once on an empty program."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    missing = [path for path in (_PYTHON, _PRLIMIT) if not os.access(path, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} not found (the sandbox runs the system's Python under util-linux's prlimit)"
    try:
        probe = subprocess.run(
            _bwrap_command(bwrap, SandboxLimits()),
            input=b"",
            capture_output=True,
            env={},
            timeout=30,
            preexec_fn=lambda: _child_setup(SandboxLimits(), None, _as_root()),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start: {exc}"
    if probe.returncode != 0:
        return f"bwrap cannot make a sandbox here: {probe.stderr.decode(errors='replace').strip()}"
    return None


def _memory_parent() -> Path | None:
    """The cgroup-v1 memory group of this process when it may make groups inside it (root, v1 controllers)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = _MEMORY_V1 / path.lstrip("/")
            writable = os.access(folder, os.W_OK) and (folder / "memory.limit_in_bytes").exists()
            return folder if writable else None
    return None


@contextlib.contextmanager
def _memory_group(limits: SandboxLimits) -> Iterator[Path | None]:
    """A fresh memory cgroup capped at ``memory_mb`` (memory and swap) for one program, removed after it; or None."""
    parent = _memory_parent()
    if parent is None:
        yield None
        return
    for stale in parent.glob("topotuner-sandbox-*"):  # left by a caller killed mid-run: empty, and old
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > 60 and not (stale / "cgroup.procs").read_text().strip():
                stale.rmdir()
    group = Path(tempfile.mkdtemp(prefix="topotuner-sandbox-", dir=parent))
    try:
        cap = str(limits.memory_mb * 2**20)
        (group / "memory.limit_in_bytes").write_text(cap)
        swap = group / "memory.memsw.limit_in_bytes"  # present where swap is accounted
        if swap.exists():
            swap.write_text(cap)
        yield group
    finally:
        for _ in range(500):  # its processes die with their namespace within moments of bwrap's end
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.01)


def _out_of_memory(group: Path | None) -> bool:
    """Whether the kernel killed a process of ``group`` for memory."""
    if group is None:
        return False
    fields = dict(line.split() for line in (group / "memory.oom_control").read_text().splitlines())
    return int(fields.get("oom_kill", 0)) > 0


def _child_setup(limits: SandboxLimits, group: Path | None, as_nobody: bool) -> None:  # pragma: no cover - child
    """In the child before ``exec``: the per-process limits, the memory group, and (for root) the ``nobody`` user.

    Its children inherit all three; as ``nobody``, the sandbox's user maps to an unprivileged one outside it.
    """
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    memory = limits.memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.file_mb * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if group is not None:
        (group / "cgroup.procs").write_text(str(os.getpid()))
    if as_nobody:
        os.setgroups([])
        os.setgid(_NOBODY)
        os.setuid(_NOBODY)


class _Ended(NamedTuple):
    """How a program's process ended, before its status is judged."""

    returncode: int | None
    output: str
    timed_out: bool
    out_of_memory: bool
    isolation: str


def _run(
    command: list[str],
    program: bytes,
    limits: SandboxLimits,
    *,
    folder: str,
    env: dict[str, str],
    group: Path | None = None,
    as_nobody: bool = False,
) -> tuple[int | None, str, bool]:
    """Run ``command`` with ``program`` on its stdin: its exit code, its output, and whether it timed out."""
    with tempfile.TemporaryFile() as log:  # unlinked at once; a file, so its size obeys RLIMIT_FSIZE
        process = subprocess.Popen(
            command,
            cwd=folder,
            env=env,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: _child_setup(limits, group, as_nobody),
        )
        timed_out = False
        try:
            process.communicate(program, timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # bwrap (its namespace dies with it), or the unsafe group
            process.wait()
        log.seek(0)
        output = log.read().decode(errors="replace")
    return process.returncode, output, timed_out


def _isolated(program: bytes, limits: SandboxLimits) -> _Ended:
    """``program`` run in a fresh bubblewrap sandbox, in its own memory group where one can be made."""
    command = _bwrap_command(str(shutil.which("bwrap")), limits)
    with _memory_group(limits) as group:
        # bwrap's own environment is empty too: the program could read it in /proc/1/environ
        ended = _run(command, program, limits, folder="/", env={}, group=group, as_nobody=_as_root())
        out_of_memory = _out_of_memory(group)
    memory = "one memory cgroup for all its processes" if group else "memory per process (no cgroup)"
    isolation = f"bubblewrap: own namespaces, no network, read-only /usr, {limits.disk_mb} MiB tmpfs, {memory}"
    return _Ended(*ended, out_of_memory, isolation)


def _unsafe(program: bytes, limits: SandboxLimits) -> _Ended:
    """``program`` run with the rlimits alone, as this user, in a temporary folder (removed after it)."""
    with tempfile.TemporaryDirectory(prefix="topotuner-sandbox-") as folder:
        env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "PYTHONDONTWRITEBYTECODE": "1"}
        ended = _run([sys.executable, "-I", "-"], program, limits, folder=folder, env=env)
    isolation = "NONE (confirm_run_unsafe_code): rlimits only, as your user, with your files and network"
    return _Ended(*ended, False, isolation)


def _status(ended: _Ended, reached_end: bool) -> Status:
    if ended.timed_out:
        return "timeout"
    if ended.returncode == 0 and reached_end:
        return "pass"
    if ended.out_of_memory:
        return "error"
    if ended.returncode in _KILLED:
        return "timeout"
    # exit code 0 short of its end: it left before running all its tests
    return "fail" if ended.returncode == 0 or "AssertionError" in ended.output else "error"


def run_program(source: str, limits: SandboxLimits | None = None, *, keep_output: int = 2000) -> SandboxResult:
    """Run ``source`` as a Python program under :class:`SandboxLimits`; never raises for what the program does.

    Raises
    ------
    SandboxUnavailableError
        bwrap cannot run here and ``limits.confirm_run_unsafe_code`` is not set.
    """
    limits = limits or SandboxLimits()
    problem = isolation_problem()
    if problem is not None and not limits.confirm_run_unsafe_code:
        raise SandboxUnavailableError(
            f"generated code would run unisolated: {problem}",
            f"{_INSTALL}, or set SandboxLimits(confirm_run_unsafe_code=True) to run it with rlimits only, "
            "able to read, write and send whatever your user can",
        )
    token = secrets.token_hex(16)  # printed after its last line: only a program that reaches its end prints it
    program = f"{source}\nprint({token!r}, flush=True)\n".encode(errors="replace")
    start = time.perf_counter()
    ended = _isolated(program, limits) if problem is None else _unsafe(program, limits)
    seconds = time.perf_counter() - start
    output = ended.output.replace(f"{token}\n", "")
    if ended.out_of_memory:
        output += f"\na process was killed at the sandbox's memory limit (memory_mb={limits.memory_mb})"
    return SandboxResult(
        _status(ended, f"{token}\n" in ended.output), ended.returncode, output[-keep_output:], seconds, ended.isolation
    )
