"""The checkpoint folder: one sub-folder per checkpoint, published atomically.

    <dir>/step-000000120/   torch.distributed.checkpoint files (every rank writes its part)
    <dir>/step-000000120/COMMITTED   written last by the chief: temp file, fsync, rename, fsync dir

A folder without COMMITTED (a crash or a kill mid-write) is never read and is cleaned up later;
the previous complete checkpoint is untouched until a newer one has been committed, so the newest
complete checkpoint is always readable.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

MARKER = "COMMITTED"
PREFIX = "step-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    """Readers see either no file or the whole file, even across a power cut."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class CheckpointStore:
    def __init__(self, root: str | Path, keep: int = 3):
        self.root = Path(root)
        self.keep = keep

    def path_for(self, step: int) -> Path:
        return self.root / f"{PREFIX}{step:09d}"

    @staticmethod
    def is_complete(path: Path) -> bool:
        return (path / MARKER).is_file()

    @staticmethod
    def step_of(path: Path) -> int:
        return int(path.name[len(PREFIX):])

    def _folders(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir()
                 if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
        return sorted(found, key=self.step_of)

    def complete(self) -> list[Path]:
        return [p for p in self._folders() if self.is_complete(p)]

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    @staticmethod
    def read_meta(path: Path) -> dict:
        return json.loads((path / MARKER).read_text())

    def commit(self, path: Path, meta: dict) -> None:
        """Chief only, after every rank's files are written: makes the checkpoint visible."""
        write_atomically(path / MARKER, json.dumps(meta, indent=2))
        _fsync_dir(self.root)

    def prune(self) -> None:
        """Chief only: keeps the newest `keep` complete checkpoints and drops incomplete folders
        older than the newest complete one (leftovers of a crash)."""
        done = self.complete()
        newest = self.step_of(done[-1]) if done else -1
        for path in done[:-self.keep]:
            shutil.rmtree(path, ignore_errors=True)
        for path in self._folders():
            if not self.is_complete(path) and self.step_of(path) < newest:
                shutil.rmtree(path, ignore_errors=True)
