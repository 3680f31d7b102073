"""A stand-in for a scaletrain process, started in a few milliseconds: it hands its arguments,
environment and its very stdin, stdout and stderr (SCM_RIGHTS) to the warm server
(tests/warm_cli.py --socket, at SCALETRAIN_WARM_SOCKET), which forks a child of an interpreter
that imported torch once and runs scaletrain there, and it stands in for that child:

- a signal it is sent (SIGINT, SIGTERM, SIGHUP) goes on to the child, and it exits as the child did
  (killed by the same signal, or with its code);
- killed outright (SIGKILL: torchrun's agent's last resort, a pool's PR_SET_PDEATHSIG), its
  connection closes and the server kills the child the same way;
- the child sees this process's parent as its own (`os.getppid()`: a launcher's worker checks
  that it is the launcher's) and runs on this process's CPUs (a slot's cores);
- a launcher's worker (SCALETRAIN_LAUNCHER_PID set) gets SIGTERM when the launcher dies, as the
  worker itself asks (distributed/env.py `die_with_launcher`), here through this process.

Three uses. Named `scaletrain` (the doc-test writes it first on a doc line's PATH, with this
interpreter as its `#!`), it is the installed command: the child runs the console script's main().
Otherwise it is SCALETRAIN_CHILD_COMMAND, what scaletrain starts its own children as (a launcher's
workers, a sweep's, tune's or autotune's trainings; set by tests/processes.py and the doc-test):
the child runs `python -m scaletrain ARGS`. A third, `warm_client.py --python ARGS`, is `python
ARGS` (a script or `-m MODULE`): the tests' own torchrun and its workers (tests/processes.py
`torchrun`). It imports nothing of torch or scaletrain: ~50 ms, where a cold start costs 5-8 s on
a small CPU."""

import ctypes
import json
import os
import signal
import socket
import sys

_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG = 1, 2
LAUNCHER_PID_ENV = "SCALETRAIN_LAUNCHER_PID"


def _dies_with_launcher() -> None:
    """SIGTERM when the parent dies, unless a signal is already asked for (a pool's SIGKILL)."""
    if not os.environ.get(LAUNCHER_PID_ENV, "").isdigit():
        return
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    current = ctypes.c_int(0)
    libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(current))
    if current.value == 0:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def main() -> int:
    _dies_with_launcher()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["SCALETRAIN_WARM_SOCKET"])
    python = sys.argv[2:] if sys.argv[1:2] == ["--python"] else None   # `--python ARGS`: as `python ARGS`
    request = {"args": [] if python else sys.argv[1:], "python": python, "cwd": os.getcwd(), "env": dict(os.environ),
               "module": os.path.basename(sys.argv[0]) != "scaletrain",
               "ppid": os.getppid(), "affinity": sorted(os.sched_getaffinity(0))}
    data = (json.dumps(request) + "\n").encode()
    sent = socket.send_fds(sock, [data], [0, 1, 2])
    sock.sendall(data[sent:])
    replies = sock.makefile("r")
    pid = json.loads(replies.readline())["pid"]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: os.kill(pid, signum))
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    if launcher.isdigit() and os.getppid() != int(launcher):
        os.kill(pid, signal.SIGTERM)   # the launcher died before the death signal was asked for
    line = replies.readline()
    if not line:
        print("scaletrain (the tests' warm client): the warm server closed before the command ended",
              file=sys.stderr)
        return 1
    code = json.loads(line)["code"]
    if code < 0:   # killed by a signal: end the same way, so the parent sees what it would have
        if -code not in (signal.SIGKILL, signal.SIGSTOP):   # those two take no handler
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main())
