"""A warm interpreter for the CLI: each command a fresh child process, without Python's start-up.

`python -m scaletrain` spends 5 s on a CPU without AVX-512 (8 s beside another test) importing
torch and torch._dynamo (every optimizer's first `add_param_group` imports dynamo) before it
reads its arguments; the suite starts a few hundred of them. This server imports them once,
then forks a child per command: a real process of its own (its own exit code, signals, files
and process-wide state, from a copy of an interpreter that has run nothing), which runs
`scaletrain` as `-m` would (runpy, `__main__`, the command's folder first on sys.path, the
command's environment) and exits through atexit as Python does. Processes the command starts
itself (torchrun's workers, a sweep's trainings) come from the `--socket` server below, through
warm_client.py (SCALETRAIN_CHILD_COMMAND), when tests/processes.py asks for them.

Protocol (one JSON line each way): the client sends {args, cwd, env, out, err}; the server
answers {"pid": N} once the child runs, then {"code": C} when it has exited (C < 0: killed by
signal -C, as subprocess reports it). One command at a time per server.

`--socket PATH` serves warm_client.py instead: the doc lines' `scaletrain` (the command a line's
shell finds first on PATH) and the processes scaletrain starts itself (SCALETRAIN_CHILD_COMMAND).
Each connection sends {args, cwd, env, module, ppid, affinity} with the client's own stdin, stdout
and stderr attached (SCM_RIGHTS), and its child runs on those very descriptors (pipes,
redirections and `&` as the shell made them) the console script's `main()`, with the script's
folder first on sys.path as the installed `scaletrain` has it, or `-m scaletrain` (module). Connections are served at
once (a background line runs beside the next): a handler process per connection, forked from the
server, which has run nothing, forks the command and reports its end.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import runpy
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

# torch and what every training imports, and lightning where it is installed (2 s a Lightning process on
# the AVX-512 CPU, 6 s without). Its import leaves one native thread (scipy's OpenBLAS pool) beside
# the one numpy's OpenBLAS already leaves; a `--compile` doc line forked from a server that had
# imported lightning hung once (2026-11-29), and hung again after lightning left the list, so it
# was not the cause: such lines start cold (doctests/test_doc_commands.py, `cold_env`).
PRELOADED = ("torch", "torch._dynamo", "torch.distributed", "torch.distributed.checkpoint", "numpy")
OPTIONAL_PRELOADED = ("lightning",)
REPO = Path(__file__).resolve().parent.parent


def start_socket_server(sock: Path, env: dict) -> subprocess.Popen:
    """This module serving `--socket sock` (ended at exit), once it listens (before it imports torch)."""
    server = subprocess.Popen([sys.executable, "-m", "tests.warm_cli", "--socket", str(sock)], cwd=REPO,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
    atexit.register(server.kill)
    for _ in range(600):
        if sock.exists() or server.poll() is not None:
            break
        time.sleep(0.1)
    assert sock.exists(), f"the warm server did not start (exit {server.poll()})"
    return server


def child_env(sock: Path) -> dict[str, str]:
    """What makes scaletrain's own child processes (a launcher's workers, a sweep's trainings) start
    from the server at `sock` (warm_client.py stands in for each: SCALETRAIN_CHILD_COMMAND)."""
    shim = Path(__file__).with_name("warm_client.py")
    return {"SCALETRAIN_WARM_SOCKET": str(sock),
            "SCALETRAIN_CHILD_COMMAND": f"{shlex.quote(sys.executable)} {shlex.quote(str(shim))}"}


def _child(request: dict, fds: tuple[int, int, int] | None = None) -> int:
    """Runs in the forked child: becomes `python -m scaletrain ARGS` in `cwd` with `env` (stdin
    empty, output to the request's files), or with `fds` the installed `scaletrain ARGS` on those
    descriptors."""
    if fds is None:
        fds = (os.open(os.devnull, os.O_RDONLY),
               *(os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for key in ("out", "err")))
    for target, fd in zip(fds, (0, 1, 2), strict=True):
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "ppid" in request:        # the stand-in's (warm_client.py) parent is this process's to its code
        # ... to this process only: a process it forks (a DataLoader worker, whose watchdog asks
        # getppid() whether its parent still lives) sees its real parent.
        real_getppid, me = os.getppid, os.getpid()
        os.getppid = lambda: request["ppid"] if os.getpid() == me else real_getppid()
    if request.get("affinity"):
        os.sched_setaffinity(0, request["affinity"])
    threads = request["env"].get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:   # what torch would read at a fresh start
        import torch
        torch.set_num_threads(int(threads))
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    console, python = request.get("console", False), request.get("python")
    # -m puts the working folder first; a script, its own folder; the installed script, its own folder.
    if python and python[0] != "-m":
        first = os.path.dirname(os.path.abspath(python[0]))
    else:
        first = os.path.dirname(sys.executable) if console else os.getcwd()
    sys.path[:] = [first, *extra, *[p for p in BASE_PATH if p not in extra]]
    _site_customize()
    sys.argv = ["scaletrain", *request["args"]]
    code = 0
    try:
        if python and python[0] == "-m":     # `python -m MODULE ARGS` (runpy sets argv[0])
            sys.argv = ["-m", *python[2:]]
            runpy.run_module(python[1], run_name="__main__", alter_sys=True)
        elif python:                         # `python SCRIPT ARGS`
            sys.argv = list(python)
            runpy.run_path(python[0], run_name="__main__")
        elif console:
            from scaletrain.cli.main import main
            sys.exit(main())
        else:
            runpy.run_module("scaletrain", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:   # noqa: BLE001 - an uncaught exception: Python prints it and exits 1
        traceback.print_exc()
        code = 1
    for thread in threading.enumerate():   # as the interpreter does at exit: non-daemon threads first
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _site_customize() -> None:
    """What a fresh interpreter's `site` does at start: imports the `sitecustomize` first on the
    command's own path (a test's hook, on its PYTHONPATH), not the one the server started with."""
    import importlib.util

    sys.modules.pop("sitecustomize", None)
    if importlib.util.find_spec("sitecustomize") is None:
        return
    try:
        import sitecustomize  # noqa: F401
    except Exception:   # noqa: BLE001 - as site.py: said, and the interpreter goes on
        print("Error in sitecustomize; set PYTHONVERBOSE for traceback:", file=sys.stderr)
        traceback.print_exc()


def serve() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)       # nothing the server imports may write into the reply channel
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                replies.close()
                code = _child(request)
            finally:
                os._exit(code)
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")


def serve_socket(listener: socket.socket) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # handlers are reaped as they end
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            code = 1
            try:
                listener.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)   # this handler waits for its command
                code = _handle(conn)
            finally:
                os._exit(code)
        conn.close()


def _handle(conn: socket.socket) -> int:
    """One connection: the command's child, its pid, then its exit code."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            return 1
        data += more
    request = json.loads(data)
    request["console"] = not request.get("module", False) and not request.get("python")   # the installed command
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            conn.close()
            code = _child(request, tuple(fds))
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    # The client killed outright (SIGKILL) closes the connection: the command dies the same way.
    # A pidfd names this very child even once it is reaped (a pid could be reused by then).
    pidfd = os.pidfd_open(pid)

    def kill_when_closed():
        with contextlib.suppress(OSError):
            while conn.recv(4096):
                pass
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)

    threading.Thread(target=kill_when_closed, daemon=True).start()
    conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
    _, status = os.waitpid(pid, 0)
    conn.sendall((json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n").encode())
    return 0


if __name__ == "__main__":
    listener = None
    if sys.argv[1:2] == ["--socket"]:   # bound at once: a command connecting early waits in the backlog
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(sys.argv[2])
        listener.listen(64)
    for name in PRELOADED:
        __import__(name)
    for name in OPTIONAL_PRELOADED:
        with contextlib.suppress(ImportError):
            __import__(name)
    # What the imports made is never collected in a child: a child's full collections would walk
    # every object of torch and lightning, copying each page they touch (copy-on-write). Eight warm
    # trainings on digits and one on two processes, the two servers run in turn twice on the AVX-512
    # CPU: 6.4 and 5.3 s frozen, 10.3 and 10.2 s not. Lightning loaded or not (frozen): 6.0 and 6.3 s
    # against 6.5 and 6.5 s.
    gc.freeze()
    # What sys.path is without the server's own folder (-m put it first): each child puts its own.
    BASE_PATH = [p for p in sys.path[1:]]
    if listener is not None:
        serve_socket(listener)
    else:
        serve()
