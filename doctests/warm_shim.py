"""The `scaletrain` a doc line's shell finds first on PATH (test_doc_commands.py puts it there,
named `scaletrain`, with this interpreter as its `#!`): it hands the command, with this process's
own stdin, stdout and stderr, to the warm server (tests/warm_cli.py --socket), which runs the
installed command's `main()` in a child forked after torch was imported; it relays the signals it
gets to that child and exits as the child did (killed by the same signal, or with its code). So a
line runs as written, minus the 5-8 s a fresh interpreter spends importing torch."""

import json
import os
import signal
import socket
import sys


def main() -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["SCALETRAIN_WARM_SOCKET"])
    request = (json.dumps({"args": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}) + "\n").encode()
    sent = socket.send_fds(sock, [request], [0, 1, 2])
    sock.sendall(request[sent:])
    replies = sock.makefile("r")
    pid = json.loads(replies.readline())["pid"]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: os.kill(pid, signum))
    line = replies.readline()
    if not line:
        print("scaletrain (doc-test shim): the warm server closed before the command ended", file=sys.stderr)
        return 1
    code = json.loads(line)["code"]
    if code < 0:   # killed by a signal: end the same way, so the shell sees what it would have
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main())
