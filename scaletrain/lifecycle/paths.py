"""Output paths checked before any work starts: a path that cannot be written is one line naming
it and the flag, not a traceback after an hour of training."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from scaletrain.errors import UserError


def _existing_ancestor(path: Path) -> Path:
    for candidate in [path, *path.parents]:
        if candidate.exists():
            return candidate
    return Path("/")


def _probe(folder: Path) -> str | None:
    """Why `folder` cannot take a new file, or None. Creates and deletes a file: permissions as
    root, read-only mounts and full disks all show up, where os.access would say yes."""
    try:
        fd, name = tempfile.mkstemp(prefix=".scaletrain-probe-", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(name)
    return None


def check_writable_dir(path: str | Path, what: str) -> Path:
    """`path` is a folder or can be made one, and files can be written into it. Creates nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {path} is a file, not a folder; pass a folder path")
    base = _existing_ancestor(path)
    if not base.is_dir():
        raise UserError(f"{what} {path} cannot be created: {base} is a file; pass another path")
    problem = _probe(base)
    if problem:
        raise UserError(f"{what} {path} cannot be written ({base}: {problem}); pass a writable path")
    return path


def check_new_output_dir(path: str | Path, what: str, holds: str) -> Path:
    """A folder for a command's results that must not already hold results (a finished result is
    never overwritten or merged into another), and can be written."""
    path = check_writable_dir(path, what)
    if path.is_dir() and any(path.iterdir()):
        raise UserError(f"{what} {path} already holds {holds}; pass a new folder (or none, for a fresh default)")
    return path


def check_writable_file(path: str | Path, what: str) -> Path:
    """`path` can be (over)written as a file: not a folder, its folder exists or can be made."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a folder; pass a file path (e.g. {path / 'out'})")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{what} {path} is not writable; pass another path")
    check_writable_dir(path.parent if str(path.parent) else Path("."), what + " folder")
    return path
