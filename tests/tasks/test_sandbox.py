"""Generated code runs in a sandbox: a hostile program can neither take the run down nor touch anything outside its
own private folder, every program's result is recorded, and without an isolation tool code runs only when the user
says so. The red team's programs are in test_sandbox_redteam.py."""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

import psutil
import pytest

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.tasks import sandbox
from topotuner_lab.tasks.sandbox import SandboxLimits, SandboxUnavailableError, isolation_problem, run_program

FAST = SandboxLimits(timeout_s=20.0, cpu_s=2, memory_mb=256)  # wall clock ample for a loaded machine: a test of
# speed would be a timed assert, and each limit that must fire is the CPU one or set by its own test
needs_bwrap = pytest.mark.skipif(
    isolation_problem() is not None and not os.environ.get("CI"),  # CI installs bubblewrap: there this must fail
    reason=f"no sandbox here: {isolation_problem()}",
)


@needs_bwrap
@pytest.mark.parametrize(
    "source, status",
    [
        pytest.param("assert sorted([3, 1, 2]) == [1, 2, 3]\nprint('ok')", "pass", id="pass"),
        pytest.param("assert 1 == 2", "fail", id="failed-assertion"),
        pytest.param("raise ValueError('bad')", "error", id="exception"),
        pytest.param("def f(:\n    pass", "error", id="syntax-error"),
    ],
)
def test_each_program_gets_a_result(source, status):
    assert run_program(source, FAST).status == status


@needs_bwrap
def test_an_infinite_loop_times_out():
    result = run_program("while True:\n    pass", FAST)
    assert result.status == "timeout" and result.seconds < 60  # it never ends by itself


@needs_bwrap
def test_a_sleeping_program_is_killed_at_the_wall_clock_limit():
    result = run_program("import time\ntime.sleep(600)", SandboxLimits(timeout_s=1.0))
    # killed long before its sleep ends; no tighter bound, since a loaded machine is slow to start and reap a sandbox
    assert result.status == "timeout" and result.seconds < 60


@needs_bwrap
def test_a_huge_allocation_fails_inside_the_sandbox():
    result = run_program("blob = bytearray(8 * 1024**3)", FAST)
    assert result.status == "error" and "MemoryError" in result.output


def _marked(marker: str) -> list[psutil.Process]:
    """Live processes whose command line holds ``marker`` (a program puts it there by exec'ing itself with it)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if marker in " ".join(proc.info.get("cmdline") or ()) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def _marking(source: str, marker: str) -> str:
    """``source`` run by a program that re-executes itself with ``marker`` in its command line."""
    return f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {source!r}, {marker!r}])"


@needs_bwrap
def test_a_fork_bomb_is_contained_and_leaves_no_process():
    marker = f"bomb-{uuid.uuid4().hex}"
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    start = time.perf_counter()
    result = run_program(_marking(bomb, marker), SandboxLimits(timeout_s=3.0, cpu_s=2, memory_mb=256))
    assert result.status == "timeout" and time.perf_counter() - start < 60  # it never ends by itself
    time.sleep(0.5)
    assert not _marked(marker)
    assert run_program("print('alive')", FAST).status == "pass"  # the machine still runs programs


@needs_bwrap
def test_a_process_that_leaves_the_session_is_killed_too():
    marker = f"escape-{uuid.uuid4().hex}"
    child = _marking("import time\ntime.sleep(60)", marker)
    escape = f"import os\nif os.fork() == 0:\n    os.setsid()\n    exec({child!r})\nprint('parent done')"
    result = run_program(escape, FAST)
    assert result.status == "pass", result
    time.sleep(0.5)
    assert not _marked(marker)


@needs_bwrap
def test_removing_the_parent_of_its_folder_touches_nothing_outside(tmp_path):
    neighbour = Path(os.environ.get("TMPDIR", "/tmp")) / f"topotuner-sandbox-neighbour-{os.getpid()}"
    neighbour.write_text("keep me")
    try:
        program = "import os, shutil\nshutil.rmtree('/tmp', ignore_errors=True)\n"  # its own folder
        program += f"shutil.rmtree({str(neighbour.parent)!r}, ignore_errors=True)\n"  # the host's, were it there
        program += "shutil.rmtree('/usr/lib/python3.11/json', ignore_errors=True)\nprint(os.listdir('.'))"
        result = run_program(program, FAST)
        assert result.status == "pass" and neighbour.read_text() == "keep me"
        assert Path("/usr/lib/python3.11/json/__init__.py").exists()
    finally:
        neighbour.unlink()


@needs_bwrap
def test_no_network():
    """Its loopback is its own: the host's servers refuse it, and nothing else is routed."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.5)
        port = server.getsockname()[1]
        result = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", FAST)
        assert result.status == "error" and "Connection refused" in result.output
        with pytest.raises(TimeoutError):
            server.accept()
    result = run_program("import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=1)", FAST)
    assert result.status == "error" and "unreachable" in result.output


@needs_bwrap
def test_the_result_names_its_isolation():
    assert run_program("print(1)", FAST).isolation.startswith("bubblewrap: own namespaces, no network")


def test_without_an_isolation_tool_code_is_refused_unless_the_user_confirms(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation_problem", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(SandboxUnavailableError, match="bwrap") as refused:
        run_program("print(1)", FAST)
    assert "apt-get install bubblewrap" in refused.value.fix and "confirm_run_unsafe_code" in refused.value.fix
    unsafe = SandboxLimits(timeout_s=20.0, confirm_run_unsafe_code=True)  # ample on a loaded machine
    result = run_program("print(1)", unsafe)
    assert result.status == "pass" and result.output == "1\n" and result.isolation.startswith("NONE")
    assert run_program("import sys\nsys.exit(0)\nprint(1)", unsafe).status == "fail"  # the same rule for a pass
    assert run_program("while True:\n    pass", SandboxLimits(timeout_s=1.0, confirm_run_unsafe_code=True)).status == (
        "timeout"
    )


def test_bad_limits_are_refused():
    with pytest.raises(ParameterError, match="timeout_s=0"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ParameterError, match="confirm_run_unsafe_code='yes'"):
        SandboxLimits(confirm_run_unsafe_code="yes")


@needs_bwrap  # the program it starts runs in the sandbox
@pytest.mark.skipif(
    sandbox._memory_parent() is None and not os.environ.get("CI"),  # CI runs as root with cgroup-v1 controllers
    reason="no memory cgroup can be made here (needs root and cgroup-v1 memory controller)",
)
def test_a_memory_group_left_by_a_killed_caller_is_removed_by_the_next_run():
    parent = sandbox._memory_parent()
    assert parent is not None
    left, fresh = (
        parent / f"topotuner-sandbox-left-{uuid.uuid4().hex}",
        parent / f"topotuner-sandbox-{uuid.uuid4().hex}",
    )
    left.mkdir()
    fresh.mkdir()  # as another run's group is between its creation and its program's start
    os.utime(left, (time.time() - 3600,) * 2)
    try:
        assert run_program("print(1)", FAST).status == "pass"
        assert not left.exists() and fresh.exists()
    finally:
        for group in (left, fresh):
            if group.exists():
                group.rmdir()
