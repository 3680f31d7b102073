"""The command scaletrain's own child processes run as in the tests (SCALETRAIN_CHILD_COMMAND, set
by tests/processes.py and the doc-test): a launcher's workers and a sweep's, tune's or autotune's
trainings. Like doctests/warm_shim.py it hands its arguments, environment and stdin/stdout/stderr
to the warm server (tests/warm_cli.py --socket), which forks a child of an interpreter that
imported torch once and runs `python -m scaletrain ARGS` there; this process stands in for it:

- a signal it is sent (SIGINT, SIGTERM, SIGHUP) goes on to the child, and it exits as the child did;
- killed outright (SIGKILL: the agent's last resort, a pool's PR_SET_PDEATHSIG), its connection
  closes and the server kills the child the same way;
- the child sees this process's parent as its own (`os.getppid()`: a launcher's worker checks
  that it is the launcher's), this process's CPU affinity (a slot's cores), and this folder;
- a launcher's worker (SCALETRAIN_LAUNCHER_PID set) gets SIGTERM when the launcher dies, as the
  worker itself asks (distributed/env.py `die_with_launcher`), here by this process, which passes it on.

Runs without torch: starting it costs ~50 ms, where a cold `python -m scaletrain` costs 5-8 s."""

import ctypes
import json
import os
import signal
import socket
import sys

_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG = 1, 2


def _dies_with_launcher() -> None:
    """SIGTERM when the parent dies, unless a signal is already asked for (a pool's SIGKILL)."""
    if not os.environ.get("SCALETRAIN_LAUNCHER_PID", "").isdigit():
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
    request = {"args": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ), "module": True,
               "ppid": os.getppid(), "affinity": sorted(os.sched_getaffinity(0))}
    data = (json.dumps(request) + "\n").encode()
    sent = socket.send_fds(sock, [data], [0, 1, 2])
    sock.sendall(data[sent:])
    replies = sock.makefile("r")
    pid = json.loads(replies.readline())["pid"]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: os.kill(pid, signum))
    launcher = os.environ.get("SCALETRAIN_LAUNCHER_PID", "")
    if launcher.isdigit() and os.getppid() != int(launcher):
        os.kill(pid, signal.SIGTERM)   # the launcher died before the death signal was asked for
    line = replies.readline()
    if not line:
        print("scaletrain (tests' warm child): the warm server closed before the command ended", file=sys.stderr)
        return 1
    code = json.loads(line)["code"]
    if code < 0:   # killed by a signal: end the same way, so the parent sees what it would have
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main())
