"""A red team's hostile programs, kept as a corpus: each escaped or gamed the earlier sandbox (a process tree hunted by
the user it ran as, rlimits, a socket-refusing prelude), and each must now be contained by its isolation or fail its
tests. Run as root, as CI does; the non-root cases run the sandbox itself as ``nobody``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

import topotuner_lab
from tests.tasks.test_sandbox import _marked, needs_bwrap
from topotuner_lab.tasks.loading import data_dir, load_task
from topotuner_lab.tasks.sandbox import SandboxLimits, _memory_parent, run_program
from topotuner_lab.training.scoring import TaskScorer

pytestmark = needs_bwrap
FAST = SandboxLimits(timeout_s=20.0, cpu_s=3, memory_mb=512)  # every program here ends by itself: wall clock ample
ROOT = pytest.mark.skipif(os.getuid() != 0, reason="runs as root, as CI does")
SYSTEM_PYTHON = "/usr/bin/python3"


def _seen(marker: str, seconds: float = 1.5) -> bool:
    """Whether a live process carrying ``marker`` shows up within ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if _marked(marker):
            return True
        time.sleep(0.05)
    return False


def _kill_marked(marker: str) -> None:
    """Clean up after a sandbox that failed to: kill (repeatedly, a chain forks on) what carries ``marker``."""
    for _ in range(50):
        procs = _marked(marker)
        if not procs:
            return
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        time.sleep(0.1)


@pytest.fixture
def marker():
    """A string unique to the test, put in the command line of the processes its program starts."""
    mark = f"redteam-{uuid.uuid4().hex}"
    yield mark
    _kill_marked(mark)


def _world_dir() -> Path:
    """A fresh folder under the system's temp folder that ``nobody`` may enter (pytest's tmp_path is private)."""
    folder = Path(tempfile.mkdtemp(prefix="redteam-"))
    folder.chmod(0o755)
    return folder


# --- 1. a setsid'd chain of forking-and-exiting processes --------------------------------------------------------

#: each generation forks the next and exits, for 6 seconds, away from the program's folder and session
CHAIN = textwrap.dedent(
    """
    import os, sys, time
    os.chdir("/")
    start = time.time()
    while time.time() - start < 6:
        try:
            if os.fork():
                os._exit(0)
        except OSError:  # at the process limit: try again
            pass
        time.sleep(0.005)
    """
)


@ROOT
def test_a_setsid_fork_chain_dies_with_the_run(marker):
    program = textwrap.dedent(
        f"""
        import os, sys
        if os.fork() == 0:
            os.setsid()
            os.execv(sys.executable, [sys.executable, "-c", {CHAIN!r}, {marker!r}])
        print("left a chain behind")
        """
    )
    result = run_program(program, FAST)
    assert result.status == "pass", result
    assert not _seen(marker), "a process of the program outlived its run"


# --- 2. reading the project, the shared data and HumanEval's solutions -------------------------------------------


@ROOT
def test_the_program_sees_no_file_of_the_host_but_the_system_interpreter():
    secrets = [
        Path(topotuner_lab.__file__).resolve(),  # the project
        Path(data_dir(), "humaneval", "HumanEval.jsonl.gz").resolve(),  # the data, canonical solutions included
        Path("/etc/passwd"),
    ]
    assert all(path.exists() for path in secrets)
    program = textwrap.dedent(
        f"""
        import os
        for path in {[str(p) for p in secrets]!r}:
            try:
                open(path, "rb").read(1)
                print("READ", path)
            except OSError:
                pass
        print("ROOT", sorted(os.listdir("/")))
        print("HOST PROCESS" if os.path.exists("/proc/{os.getpid()}") else "no host process")
        """
    )
    result = run_program(program, FAST)
    assert result.status == "pass", result
    assert "READ" not in result.output and "no host process" in result.output
    assert "ROOT ['bin', 'dev', 'lib', 'lib64', 'proc', 'tmp', 'usr', 'work']" in result.output


# --- 3. writing outside its folder; no total disk limit; memory per process --------------------------------------


@ROOT
def test_files_written_outside_its_folder_do_not_reach_the_host():
    name = f"redteam-{uuid.uuid4().hex}"
    places = [Path("/tmp", name), Path("/var/tmp", name), Path("/dev/shm", name)]
    program = textwrap.dedent(
        f"""
        for path in {[str(p) for p in places]!r}:
            try:
                open(path, "w").write("left behind")
            except OSError:
                pass
        """
    )
    try:
        assert run_program(program, FAST).status == "pass"
        assert not [path for path in places if path.exists()]
    finally:
        for path in places:
            path.unlink(missing_ok=True)


def test_its_files_together_stay_within_disk_mb():
    program = textwrap.dedent(
        """
        written = 0
        try:
            for i in range(38):  # 304 MiB in files of 8 MiB, each below the file-size limit
                with open(f"blob{i}", "wb") as f:
                    for _ in range(8):
                        f.write(b"x" * 2**20)
                        written += 1
        except OSError:
            pass
        print("WRITTEN", written)
        """
    )
    result = run_program(program, FAST)
    written = int(result.output.split("WRITTEN")[1].split()[0])
    assert written <= FAST.disk_mb, result


@pytest.mark.skipif(
    _memory_parent() is None and not os.environ.get("CI"),  # CI runs as root with cgroup-v1 controllers
    reason="no memory cgroup can be made here (needs root and cgroup-v1 memory controller)",
)
def test_its_processes_together_stay_within_memory_mb():
    program = textwrap.dedent(
        """
        import os, time
        kids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                held = b"x" * (200 * 2**20)  # written, so resident
                time.sleep(2)
                os._exit(0)
            kids.append(pid)
        survived = sum(os.waitpid(pid, 0)[1] == 0 for pid in kids)
        print("SURVIVED", survived)
        """
    )
    result = run_program(program, SandboxLimits(timeout_s=20.0, memory_mb=300))
    assert "SURVIVED 3" not in result.output, result  # 600 MiB held at once against a 300 MiB cap


# --- 4. filesystem Unix sockets -----------------------------------------------------------------------------------


@ROOT
def test_a_unix_socket_on_the_host_is_out_of_reach():
    folder = _world_dir()
    path = folder / "server.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        server.bind(str(path))
        path.chmod(0o777)
        server.settimeout(1.0)
        program = f"import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\ns.sendto(b'hi', {str(path)!r})"
        run_program(program, FAST)
        with pytest.raises(TimeoutError):
            server.recv(16)
    finally:
        server.close()
        shutil.rmtree(folder)


# --- 5. the sandbox run by a user other than root -----------------------------------------------------------------

HARNESS = textwrap.dedent(
    """
    import json, sys
    from topotuner_lab.tasks.sandbox import SandboxLimits, run_program
    programs = json.load(sys.stdin)  # not in its command line, where a program's marker would show
    limits = SandboxLimits(timeout_s=5.0, processes=8)
    print(json.dumps({name: run_program(source, limits).output for name, source in programs.items()}))
    """
)


def _as_nobody(programs: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """The outputs of ``programs`` run by the sandbox in a process of ``nobody`` (the system's Python; the package
    copied where ``nobody`` may read it)."""
    folder = _world_dir()
    try:
        shutil.copytree(
            Path(topotuner_lab.__file__).parent, folder / "topotuner_lab", ignore=shutil.ignore_patterns("__pycache__")
        )
        for path in folder.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        done = subprocess.run(
            [SYSTEM_PYTHON, "-c", HARNESS],
            input=json.dumps(programs),
            env={**env, "PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"},
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=120,
            user=65534,
            group=65534,
            extra_groups=[],
        )
    finally:
        shutil.rmtree(folder)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


LONG_SLEEP = "import time; time.sleep(30)"


@pytest.fixture(scope="module")
def run_by_nobody():
    """Hostile programs run by the sandbox in a process of ``nobody`` whose environment holds HF_TOKEN: their
    outputs, the secret, whether the loopback server got a connection, and whether a process they left survived."""
    if os.getuid() != 0:
        pytest.skip("runs as root, as CI does")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    secret, marker = uuid.uuid4().hex, f"redteam-{uuid.uuid4().hex}"
    programs = {
        "raw socket": f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))\nprint('CONNECTED')",
        "environ": textwrap.dedent(
            """
            import os
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    print(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
                except OSError:
                    pass
            """
        ),
        "escape": textwrap.dedent(
            f"""
            import os, subprocess
            os.chdir("/")
            if os.fork() == 0:  # a double fork into a new session
                os.setsid()
                if os.fork() == 0:
                    os.execv("/usr/bin/python3", ["python3", "-c", {LONG_SLEEP!r}, {marker!r}])
                os._exit(0)
            subprocess.Popen(["nohup", "python3", "-c", {LONG_SLEEP!r}, {marker!r}], start_new_session=True)
            """
        ),
        "processes": textwrap.dedent(
            """
            import os, time
            started = 0
            for _ in range(60):
                try:
                    if os.fork() == 0:
                        time.sleep(3)
                        os._exit(0)
                    started += 1
                except OSError:
                    break
            print("STARTED", started)
            """
        ),
    }
    try:
        outputs = _as_nobody(programs, {"HF_TOKEN": secret})
        try:
            listener.accept()[0].close()
            connected = True
        except TimeoutError:
            connected = False
        yield {"outputs": outputs, "secret": secret, "connected": connected, "survived": _seen(marker)}
    finally:
        listener.close()
        _kill_marked(marker)


def test_run_by_another_user_a_raw_socket_reaches_no_network(run_by_nobody):
    assert not run_by_nobody["connected"] and "CONNECTED" not in run_by_nobody["outputs"]["raw socket"]


def test_run_by_another_user_the_callers_environment_is_out_of_reach(run_by_nobody):
    assert run_by_nobody["secret"] not in run_by_nobody["outputs"]["environ"]


def test_run_by_another_user_setsid_double_fork_and_nohup_children_die_with_the_run(run_by_nobody):
    assert not run_by_nobody["survived"]


def test_run_by_another_user_the_processes_are_capped(run_by_nobody):
    assert int(run_by_nobody["outputs"]["processes"].split("STARTED")[1].split()[0]) < 8  # processes=8


# --- 6. the caller killed while a program runs --------------------------------------------------------------------


@ROOT
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_caller_takes_its_program_along_and_leaves_no_folder(marker, sig):
    before = set(Path(tempfile.gettempdir()).glob("topotuner-sandbox-*"))
    program = f"import os\nos.execv('/usr/bin/python3', ['python3', '-c', 'import time; time.sleep(60)', {marker!r}])"
    caller = subprocess.Popen(  # the program in its environment, not its command line, where the marker would show
        [
            sys.executable,
            "-c",
            "import os\nfrom topotuner_lab.tasks.sandbox import run_program\nrun_program(os.environ['P'])",
        ],
        env={**os.environ, "P": program},
    )
    try:
        assert _seen(marker, 20), "the program never started"
        caller.send_signal(sig)
        caller.wait(10)
        time.sleep(0.5)
        assert not _seen(marker), f"the program outlived its caller's {sig.name}"
        assert set(Path(tempfile.gettempdir()).glob("topotuner-sandbox-*")) <= before
    finally:
        caller.kill()
        for folder in set(Path(tempfile.gettempdir()).glob("topotuner-sandbox-*")) - before:
            shutil.rmtree(folder, ignore_errors=True)


# --- 7. pass@1 gamed by leaving early -----------------------------------------------------------------------------

EARLY_EXITS = {
    "exit()": "exit()",
    "sys.exit(0)": "import sys\nsys.exit(0)",
    "os._exit(0)": "import os\nos._exit(0)",
    "raise SystemExit": "raise SystemExit",
}


@pytest.mark.parametrize("task", ["humaneval", "mbpp"])
@pytest.mark.parametrize("exit_call", EARLY_EXITS.values(), ids=EARLY_EXITS.keys())
def test_a_program_that_exits_before_its_tests_fails_them(task, exit_call):
    rows = load_task(task, "test", 5, 0)
    completion = textwrap.indent(exit_call, "    ") + "\n" if task == "humaneval" else exit_call + "\n"
    scorer = TaskScorer(task, tokenizer=None)
    scorer.answers = lambda model, ds: [completion] * len(ds)  # type: ignore[method-assign]  # no model
    assert scorer.score_all(None, rows)["pass@1"].tolist() == [0.0] * 5


def test_a_program_passes_only_when_it_reaches_its_end():
    assert run_program("print('tests done')", FAST).status == "pass"
    for source in EARLY_EXITS.values():
        result = run_program(f"{source}\nprint('tests done')", FAST)
        assert result.status == "fail" and result.returncode == 0, result
    guess = run_program("import sys\nprint(sys.stdin.read(), open('/proc/self/cmdline').read())\nexit()", FAST)
    assert guess.status == "fail"  # the token is on no input it can read


# --- 8. a timeout's exit code -------------------------------------------------------------------------------------


def test_a_timeout_never_reports_exit_code_0():
    for source in ("while True:\n    pass", "import time\ntime.sleep(60)"):
        result = run_program(source, SandboxLimits(timeout_s=1.0))
        assert result.status == "timeout" and result.returncode not in (0, None), result
