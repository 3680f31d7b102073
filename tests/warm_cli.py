"""A warm interpreter for the CLI: each command a fresh child process, without Python's start-up.

`python -m scaletrain` spends 5 s on a CPU without AVX-512 (8 s beside another test) importing
torch and torch._dynamo (every optimizer's first `add_param_group` imports dynamo) before it
reads its arguments; the suite starts a few hundred of them. This server imports them once,
then forks a child per command: a real process of its own (its own exit code, signals, files
and process-wide state, from a copy of an interpreter that has run nothing), which runs
`scaletrain` as `-m` would (runpy, `__main__`, the command's folder first on sys.path, the
command's environment) and exits through atexit as Python does. Processes the command starts
itself (torchrun's workers, a sweep's trainings) are ordinary ones.

Protocol (one JSON line each way): the client sends {args, cwd, env, out, err}; the server
answers {"pid": N} once the child runs, then {"code": C} when it has exited (C < 0: killed by
signal -C, as subprocess reports it). One command at a time per server.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
import traceback

PRELOADED = ("torch", "torch._dynamo", "torch.distributed", "torch.distributed.checkpoint", "numpy")


def _child(request: dict) -> int:
    """Runs in the forked child: becomes `python -m scaletrain ARGS` in `cwd` with `env`."""
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    threads = request["env"].get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:   # what torch would read at a fresh start
        import torch
        torch.set_num_threads(int(threads))
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *[p for p in BASE_PATH if p not in extra]]
    sys.argv = ["scaletrain", *request["args"]]
    code = 0
    try:
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


if __name__ == "__main__":
    for name in PRELOADED:
        __import__(name)
    # What sys.path is without the server's own folder (-m put it first): each child puts its own.
    BASE_PATH = [p for p in sys.path[1:]]
    serve()
