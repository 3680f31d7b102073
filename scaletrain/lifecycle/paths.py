"""Output paths checked before any work starts: a path that cannot be written is one line naming
it and the flag, not a traceback after an hour of training."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from scaletrain.errors import UserError


def _existing_ancestor(path: Path) -> Path:
    for candidate in [path, *path.parents]:
        if candidate.exists():
            return candidate
    return Path("/")


def _probe_file(folder: Path) -> str | None:
    """Why `folder` cannot take a new file, or None. Creates and deletes a file: permissions as
    root, read-only mounts and full disks all show up, where os.access would say yes."""
    try:
        fd, name = tempfile.mkstemp(prefix=".scaletrain-probe-", dir=folder)
    except OSError as exc:
        return f"creating a file in {folder}: {exc.strerror or exc}"
    os.close(fd)
    os.unlink(name)
    return None


def _probe(path: Path, base: Path) -> str | None:
    """Why `path` (whose nearest existing folder is `base`) cannot be made and written, in the OS's
    words for what was actually tried: the first missing folder is made (and removed again), as
    the run would make it, then a file is made in it. (A pseudo file system such as /proc refuses
    the folder itself: "creating /proc/x: No such file or directory", not a claim about /proc.)"""
    if base == path:
        return _probe_file(base)
    first = base / path.parts[len(base.parts)]
    try:
        os.mkdir(first)
    except FileExistsError:   # made meanwhile by someone else: probe it as it is
        return _probe_file(first)
    except OSError as exc:
        return f"creating {first}: {exc.strerror or exc}"
    try:
        return _probe_file(first)
    finally:
        try:
            os.rmdir(first)
        except OSError:   # another process (a run starting beside this one) has filled it meanwhile
            pass


def check_writable_dir(path: str | Path, what: str) -> Path:
    """`path` is a folder or can be made one, and files can be written into it. Leaves nothing
    behind (a folder made to try it is removed)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {path} is a file, not a folder; pass a folder path")
    base = _existing_ancestor(path)
    if not base.is_dir():
        raise UserError(f"{what} {path} cannot be created: {base} is a file; pass another path")
    problem = _probe(path, base)
    if problem:
        raise UserError(f"{what} {path} cannot be written ({problem}); pass a writable path")
    return path


def check_new_output_dir(path: str | Path, what: str, holds: str) -> Path:
    """A folder for a command's results that must not already hold results (a finished result is
    never overwritten or merged into another), and can be written."""
    path = check_writable_dir(path, what)
    if path.is_dir() and any(path.iterdir()):
        raise UserError(f"{what} {path} already holds {holds}; pass a new folder (or none, for a fresh default)")
    return path


def check_writable_file(path: str | Path, what: str) -> Path:
    """`path` can be (over)written as a file: not a folder, not a file a run owns, its folder
    exists or can be made."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a folder; pass a file path (e.g. {path / 'out'})")
    owner = run_owning(path)
    if owner is not None:
        raise UserError(f"{what} {path} is a file of run {owner.run_id or '?'} ({owner.path}); a command never "
                        "writes over a run's own files: pass another path")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{what} {path} is not writable; pass another path")
    check_writable_dir(path.parent if str(path.parent) else Path("."), what + " folder")
    return path


FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_folder_name(name: str, what: str) -> str:
    """A name that becomes one folder under the folder it belongs to (a study's, under the run
    store's): letters, digits, '.', '_' and '-', so '..' or a '/' cannot place it anywhere else."""
    if not FOLDER_NAME.fullmatch(name):
        raise UserError(f"{what} {name!r} is not a plain name (letters, digits, '.', '_', '-'; at most 100, "
                        "not starting with '.' or '-'); pass one, or --out for a folder elsewhere")
    return name


def run_owning(path: Path):
    """The run folder whose own file `path` is (its run.json, model.pt, summary.json, ..., or
    anything under its checkpoints/), or None."""
    from scaletrain.lifecycle.folder import RUN_FILES, enclosing_run
    resolved = path.resolve()
    folder = enclosing_run(resolved.parent)
    if folder is None:
        return None
    inside = resolved.relative_to(folder.path).parts
    return folder if inside and inside[0] in RUN_FILES else None
