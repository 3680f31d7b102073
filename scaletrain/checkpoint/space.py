"""Disk space set aside for what a run writes at its end, so that a disk that fills while it
trains cannot cost its results (issue 66: a full disk at model.pt lost the trained weights, and
run.json kept saying "running").

- `Reserved`: a file's space allocated when the run starts (`posix_fallocate`: a disk without
  room refuses the run in one line before it trains), written in place at the end and renamed to
  its name; a run that ends otherwise gives the space back.
- `overwrite_in_place`: a small file rewritten inside the blocks it already holds (run.json is
  written padded to RUN_RECORD_BYTES), for when the atomic rewrite (a temporary file beside it)
  finds no space: its status is then still written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from scaletrain.checkpoint.store import _fsync_dir
from scaletrain.errors import write_failed

RUN_RECORD_BYTES = 4096   # run.json's size on disk, padded: every status it will hold fits in place


def padded(text: str, size: int = RUN_RECORD_BYTES) -> str:
    """JSON text followed by spaces up to `size` bytes (JSON readers skip trailing whitespace)."""
    return text + " " * max(0, size - len(text.encode()))


def overwrite_in_place(path: Path, text: str) -> None:
    """Writes `text` over `path`'s existing bytes, padded with spaces to its size: no new block is
    needed. Not atomic against a power cut (the atomic rewrite is tried first; this is its fallback
    on a full disk). Raises OSError where the text does not fit."""
    data = text.encode()
    with path.open("r+b") as fh:
        size = os.fstat(fh.fileno()).st_size
        if len(data) > size:
            raise OSError(28, os.strerror(28), str(path))
        fh.write(data + b" " * (size - len(data)))
        fh.flush()
        os.fsync(fh.fileno())


class Reserved:
    """`size` bytes set aside for `path` (written at the end of the run) in a hidden file beside it."""

    def __init__(self, path: Path, size: int, what: str):
        self.path, self.what = Path(path), what
        self.spare = self.path.with_name(f".{self.path.name}.reserved")
        try:
            fd = os.open(self.spare, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            try:
                os.posix_fallocate(fd, 0, max(size, 1))
            finally:
                os.close(fd)
        except OSError as exc:
            self.spare.unlink(missing_ok=True)
            raise write_failed(self.path, exc, f"{what} (its {size / 2**20:.1f} MiB set aside before training)",
                               then="run again (nothing was trained)") from None

    def write(self, write: Callable[[BinaryIO], None]) -> None:
        """`write(fh)` writes the file into the set-aside space (beyond it, the disk is asked for
        more, as any write); then it is cut to its length and renamed into place. A failure names
        the path and the OS's reason (found in the chain of a library's wrapping error)."""
        try:
            with self.spare.open("r+b") as fh:
                write(fh)
                fh.truncate()
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(self.spare, self.path)
        except (OSError, RuntimeError) as exc:   # torch.save reports the OSError it met as a RuntimeError
            self.spare.unlink(missing_ok=True)     # a partial file is no use: the space goes back
            raise write_failed(self.path, exc, self.what) from None
        _fsync_dir(self.path.parent)

    def release(self) -> None:
        """Gives the space back (a run that ended without writing the file)."""
        self.spare.unlink(missing_ok=True)
