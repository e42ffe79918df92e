"""Generated code runs in a sandbox: a hostile program can neither take the run down nor touch anything outside its
own temporary folder, and every program's result is recorded."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.tasks.sandbox import SandboxLimits, run_program

FAST = SandboxLimits(timeout_s=3.0, cpu_s=2, memory_mb=256)


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


def test_an_infinite_loop_times_out():
    result = run_program("while True:\n    pass", FAST)
    assert result.status == "timeout" and result.seconds < FAST.timeout_s + 2


def test_a_sleeping_program_is_killed_at_the_wall_clock_limit():
    result = run_program("import time\ntime.sleep(60)", SandboxLimits(timeout_s=1.0))
    assert result.status == "timeout" and result.seconds < 3


def test_a_huge_allocation_fails_inside_the_sandbox():
    result = run_program("blob = bytearray(8 * 1024**3)", FAST)
    assert result.status == "error" and "MemoryError" in result.output


def _processes_in(prefix: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cwd"]):
        if (proc.info.get("cwd") or "").startswith(prefix):
            found.append(proc)
    return found


def test_a_fork_bomb_is_contained_and_leaves_no_process():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    start = time.perf_counter()
    result = run_program(bomb, FAST)
    assert result.status == "timeout" and time.perf_counter() - start < FAST.timeout_s + 5
    time.sleep(0.5)
    assert not _processes_in("/tmp/topotuner-sandbox-")
    assert run_program("print('alive')", FAST).status == "pass"  # the machine still runs programs


def test_a_process_that_leaves_the_session_is_killed_too():
    escape = textwrap.dedent(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(60)
        """
    )
    result = run_program(escape, FAST)
    assert result.status == "pass", result
    time.sleep(0.5)
    assert not _processes_in("/tmp/topotuner-sandbox-")


def test_removing_the_parent_of_its_folder_touches_nothing_outside(tmp_path):
    neighbour = Path(os.environ.get("TMPDIR", "/tmp")) / f"topotuner-sandbox-neighbour-{os.getpid()}"
    neighbour.write_text("keep me")
    try:
        program = "import os, shutil\nshutil.rmtree(os.path.abspath('..'), ignore_errors=True)\n"
        program += "shutil.rmtree('/tmp', ignore_errors=True)\nprint(os.listdir('.'))"
        result = run_program(program, FAST)
        assert result.status == "pass" and neighbour.read_text() == "keep me"
    finally:
        neighbour.unlink()


def test_no_network():
    program = "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)"
    result = run_program(program, FAST)
    assert result.status == "error" and ("unreachable" in result.output or "network is disabled" in result.output)


def test_bad_limits_are_refused():
    with pytest.raises(ParameterError, match="timeout_s=0"):
        SandboxLimits(timeout_s=0)
