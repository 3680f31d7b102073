"""An exclusive lock on a run folder, held by the training that uses it.

fcntl.flock on `<run folder>/.lock`: the kernel drops the lock when the holding process exits
or is killed, so a SIGKILLed training never leaves a stale lock behind, and a second training in
the same folder is refused at once with the holder's host and pid (written into the file).
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from scaletrain.errors import UserError, write_failed

LOCK_FILE = ".lock"


class RunFolderBusy(UserError):
    """Another training holds the run folder."""


class FolderLock:
    def __init__(self, folder: Path):
        self.path = Path(folder) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Takes the lock or raises RunFolderBusy naming the holder; never waits."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:     # a full disk (no room for the file's entry), a read-only folder
            raise write_failed(self.path, exc, "the run folder's lock",
                               then="run again (nothing was trained)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunFolderBusy(f"run folder {self.path.parent} is in use by another training ({self.holder()}); "
                                "wait for it to end, or pass another --run-dir") from None
        self._fd = fd
        try:    # who holds it, for the next one refused: a help, which a full disk may not have room for
            os.ftruncate(fd, 0)
            os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        except OSError:
            pass

    def holder(self) -> str:
        try:
            host, pid = self.path.read_text().split()
            return f"host {host}, pid {pid}"
        except (OSError, ValueError):
            return "holder unknown"

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None
