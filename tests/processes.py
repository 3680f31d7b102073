"""Running the real CLI and the real torchrun launcher as subprocesses, and finding their workers.

A test that starts a process says so by taking the `processes` fixture (conftest.py at the root;
one parameter of a test: `pytest.param(..., marks=pytest.mark.processes)`): that alone puts it in
the `processes` tier, which `make check` leaves out. Any other test that
tries is stopped at the attempt (`starting_processes`), whichever helper or library it goes
through, so a new helper can never quietly put a process-starting test into `make check`. What
counts is what costs seconds: an interpreter (Python, so torch's import; a shell, which may run
anything) or a launcher. A quick tool the library asks on the way (`uname -p` for the CPU's name,
`git rev-parse` for the run's record, the C++ compiler's version) is not a process in this sense.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.warm_cli import child_env, start_socket_server

PLUGINS = Path(__file__).parent / "plugins"
# Small and quick: the MLP on digits, no progress bar.
DIGITS_MLP = ["--model", "mlp", "--model-option", "hidden=[64]", "--data", "digits", "--no-progress",
              "--target-accuracy", "0.999",  # never stop early (the default recipe stops at 0.94)
              "--lr", "0.003"]


class UndeclaredProcess(RuntimeError):
    pass


_declared = False


# Programs that start an interpreter or a job (by the executable's name).
INTERPRETERS = ("python", "torchrun", "scaletrain", "sh", "bash", "dash", "env", "sudo", "nsenter", "unshare", "ip")


def starts_an_interpreter(args) -> bool:
    first = args if isinstance(args, (str, bytes, os.PathLike)) else (args[0] if args else "")
    first = os.fsdecode(first).split()[0] if os.fsdecode(first).strip() else ""
    program = os.path.basename(first)
    return first == sys.executable or any(program == name or (name == "python" and program.startswith(name))
                                          for name in INTERPRETERS)


def _refuse(*_args, **_kwargs):
    raise UndeclaredProcess("this test starts a process without taking the `processes` fixture: add it to "
                            "the test's arguments (or `pytestmark = pytest.mark.usefixtures(\"processes\")` for "
                            "a module of such tests), which puts it in the tier `make check` leaves out")


def _require_declared() -> None:
    if not _declared:
        _refuse()


@contextlib.contextmanager
def starting_processes(declared: bool):
    """Around one test (conftest.py's hook, setup to teardown): a test that declared it may start
    processes; for any other, every way a process starts (subprocess, multiprocessing's spawn and
    forkserver, this module's warm CLI) raises UndeclaredProcess. A fork stays allowed: a
    DataLoader's workers are the test's own process, copied, not a new interpreter."""
    global _declared
    import multiprocessing.util
    saved = (_declared, subprocess.Popen._execute_child, multiprocessing.util.spawnv_passfds)
    _declared = declared
    if not declared:
        execute = saved[1]

        def guarded(popen, args, *rest, **kwargs):
            if starts_an_interpreter(args):
                _refuse()
            return execute(popen, args, *rest, **kwargs)
        subprocess.Popen._execute_child = guarded
        multiprocessing.util.spawnv_passfds = _refuse       # spawn and forkserver start Python
    try:
        yield
    finally:
        _declared, subprocess.Popen._execute_child, multiprocessing.util.spawnv_passfds = saved


def cli_env(**extra) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def run(args, cwd, timeout=240, cold=False, **env) -> subprocess.CompletedProcess:
    """`python -m scaletrain ARGS` in `cwd`, as a process of its own, started from a warm
    interpreter (warm_cli.py: torch already imported; 5-8 s less a command on a slow CPU).
    SCALETRAIN_TESTS_COLD=1 (or `cold`, for this command) starts it, and all it starts, with a
    plain subprocess instead."""
    _require_declared()
    if cold or os.environ.get("SCALETRAIN_TESTS_COLD") == "1":
        return subprocess.run([sys.executable, "-m", "scaletrain", *args], capture_output=True, text=True,
                              cwd=cwd, env=cli_env(**env), timeout=timeout)
    # What the command starts itself (a launcher's workers, a sweep's or autotune's trainings)
    # starts warm too, from this process's socket server (warm_client.py stands in for each).
    return _warm.run([str(a) for a in args], str(cwd), cli_env(**warm_children(), **env), timeout)


def python(args, cwd, timeout=240, **env) -> subprocess.CompletedProcess:
    """`python ARGS` (a script and its arguments, or `-m MODULE ...`) in `cwd`, as a process of its
    own, started warm from this process's socket server (cold under SCALETRAIN_TESTS_COLD=1)."""
    _require_declared()
    return subprocess.run([*python_command(), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=cli_env(**warm_children(), **env), timeout=timeout)


def torchrun(nproc: int, args, cwd, timeout=240, **env) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node NPROC ARGS` (ARGS: a script and its arguments, or
    `-m MODULE ...`): the launcher and each worker a process of its own, each started warm (the
    launcher runs the workers with --no-python through the same client)."""
    command = python_command()
    return python(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                   *(["--no-python", *command] if len(command) > 1 else []), *args], cwd, timeout, **env)


def python_command() -> list[str]:
    """What runs `python ARGS` here: warm_client.py --python, or this interpreter when cold."""
    if os.environ.get("SCALETRAIN_TESTS_COLD") == "1":
        return [sys.executable]
    return [sys.executable, str(Path(__file__).with_name("warm_client.py")), "--python"]


def warm_children() -> dict[str, str]:
    """The environment under which the scaletrain commands a process starts (through
    `scaletrain_command()`) start warm, from this pytest process's socket server; none under
    SCALETRAIN_TESTS_COLD=1."""
    return {} if os.environ.get("SCALETRAIN_TESTS_COLD") == "1" else _children_server()


@functools.cache
def _children_server() -> dict[str, str]:
    """SCALETRAIN_CHILD_COMMAND and the socket of this pytest process's warm server for children."""
    sock = Path(tempfile.mkdtemp(prefix="scaletrain-children-")) / "server"
    start_socket_server(sock, cli_env())
    return child_env(sock)


class _WarmCli:
    """The client of this pytest process's warm_cli server (started on first use)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.buffer = b""
        self.lock = threading.Lock()

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.warm_cli"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent, env=cli_env())
        self.buffer = b""
        atexit.register(self.proc.kill)

    def _reply(self, timeout: float | None) -> dict | None:
        """The server's next line, or None when `timeout` passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the warm CLI server exited ({self.proc.wait()})")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, args: list[str], cwd: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
        with self.lock, tempfile.TemporaryDirectory() as tmp:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"args": args, "cwd": cwd, "env": env, "out": str(out), "err": str(err)}
            pid = None
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
                pid = self._reply(None)["pid"]
                done = self._reply(timeout)
            except BaseException:
                # Interrupted mid-command (pytest-timeout's limit, Ctrl-C): the server's reply for
                # this command is still to come, so the next command would read it as its own. The
                # command and this server end here; the next command starts a fresh server.
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                raise
            if done is None:
                os.kill(pid, signal.SIGKILL)
                self._reply(None)
                raise subprocess.TimeoutExpired(["scaletrain", *args], timeout,
                                                out.read_bytes(), err.read_bytes())
            return subprocess.CompletedProcess(["scaletrain", *args], done["code"],
                                               out.read_text(errors="replace"), err.read_text(errors="replace"))


_warm = _WarmCli()


def run_here(args, cwd, **env) -> subprocess.CompletedProcess:
    """The CLI's own main() in this process, for commands that only read and print (the run
    store's `runs` commands and exports, plans, argument errors): the code `run` reaches, without
    the 2-5 s of starting Python and torch. Anything that trains or launches keeps `run`
    (process-wide state, real exits). `env` is set for the call only. An uncaught exception
    propagates and fails the test, as a traceback would."""
    from scaletrain.cli.main import main
    out, err, before = io.StringIO(), io.StringIO(), os.getcwd()
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exc:   # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(before)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def start(args, cwd, log: Path, **env) -> subprocess.Popen:
    """Starts the CLI in its own process group (so a test can always clean it up)."""
    fh = log.open("w")
    return subprocess.Popen([sys.executable, "-m", "scaletrain", *args], stdout=fh, stderr=subprocess.STDOUT,
                            cwd=cwd, env=cli_env(**env), start_new_session=True)


def children(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        kids = [c for p in frontier for c in children(p)]
        found += kids
        frontier = kids
    return found


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILLs the CLI and every process under it (the elastic agent starts its workers in new
    process groups, so killing the group alone would leave them behind)."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def outputs_of(tasks: list[subprocess.Popen], timeout: float) -> list[str]:
    """What each task (started with stdout=PIPE, text=True) printed, once all have ended. Past
    `timeout` s for all together, every task is killed and the test fails with the end of what
    each had printed: a job that hangs says where, instead of a bare TimeoutExpired."""
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for task in tasks:
            outputs.append(task.communicate(timeout=max(0.0, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        for task in tasks:
            task.kill()
        left = [task.communicate()[0] for task in tasks[len(outputs):]]
        printed = "\n\n".join(f"--- task {i} (exit {task.returncode}) ---\n{(out or '')[-3000:]}"
                                for i, (task, out) in enumerate(zip(tasks, outputs + left, strict=True)))
        raise AssertionError(f"the tasks had not all ended after {timeout:g} s:\n{printed}") from None
    finally:
        for task in tasks:
            task.kill()
    return outputs


def wait_for(condition, timeout: float, what: str, poll: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def committed_steps(checkpoint_dir: Path) -> list[int]:
    if not checkpoint_dir.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in checkpoint_dir.glob("step-*") if (p / "COMMITTED").is_file())


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def assert_a_raising_rank_ends_the_job(args, cwd, injected: str, rank: int, guard_s: float = 100) -> None:
    """Runs the CLI with a model that raises on `rank`: the whole job must end, non-zero, naming
    the injected failure and the failed rank. The others would otherwise wait in a collective until
    its timeout (--step-timeout-s, 120 s; 600 s before the first step): the run's guard, `guard_s`,
    is shorter, so a job left waiting fails here (subprocess.TimeoutExpired)."""
    result = run(args, cwd, timeout=guard_s)
    assert result.returncode != 0
    assert injected in result.stderr
    assert f"scaletrain: error: worker rank {rank} failed" in result.stderr


def kill_slowed_run_after_checkpoint(args: list[str], cwd: Path, run_dir: Path, step: int, delay_s: float) -> None:
    """Runs the CLI with the MLP swapped for its slowed twin (the same weights and arithmetic) and
    SIGKILLs it, launcher and workers, once a checkpoint at or after `step` is committed."""
    slow = [a if a != "mlp" else "faulty_models:slow_mlp" for a in args] + ["--model-option", f"delay_s={delay_s}"]
    proc = start(slow, cwd, cwd / f"{run_dir.name}.log")
    try:
        wait_for(lambda: any(s >= step for s in committed_steps(run_dir / "checkpoints")), 120,
                 f"a checkpoint at step {step}")
    finally:
        kill_group(proc)


def free_port() -> int:
    """A TCP port nothing listens on now, on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
