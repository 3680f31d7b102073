"""The checkpoint folder: one sub-folder per checkpoint, published atomically.

    <dir>/step-000000120/   torch.distributed.checkpoint files (every rank writes its part)
    <dir>/step-000000120/COMMITTED   written last by the chief: temp file, fsync, rename, fsync dir

owner.json names the run whose checkpoints the folder holds (written before its first save): a
run saves and resumes only in a folder that is its own or no run's, so two runs pointed at one
folder never mix, and keep-K never deletes another run's checkpoints.

COMMITTED holds the loop position and a manifest: every file of the checkpoint with its size and
SHA-256. A folder without COMMITTED (a crash or a kill mid-write) is never read and is cleaned up
later; one whose files do not match its manifest (truncated, zeroed, deleted, a garbage marker)
is skipped with a warning naming it, and the next-older verified checkpoint is used. The previous
checkpoint is untouched until a newer one has been committed, so a crash mid-save never costs the
last good one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from scaletrain.errors import UserError, WriteFailed, write_failed
from scaletrain.files import read_json

MARKER = "COMMITTED"
# The loop position a marker's meta holds (Trainer.position): counts, read as such on resume.
POSITION_COUNTS = ("global_step", "epoch", "epoch_step", "world_size", "global_batch", "steps_per_epoch")
PREFIX = "step-"
OWNER = "owner.json"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    """Readers see either no file or the whole file, even across a power cut. A write that fails
    (a full disk) leaves the old file as it was and no temporary file, and raises WriteFailed."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_failed(path, exc) from None
    _fsync_dir(path.parent)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class CheckpointStore:
    def __init__(self, root: str | Path, keep: int = 3, owner: str | None = None):
        self.root = Path(root)
        self.keep = keep
        self.owner = owner     # the run id this store saves for (None: no owner checks)

    def failed_save(self, path: Path, exc: BaseException) -> WriteFailed:
        """After a save to `path` failed: its partial folder is removed (never read anyway, and
        on a full disk it holds the space the run's status still needs), and the failure is one
        line with the OS's reason. DCP wraps the OS's error in its own (a full disk reads
        "unexpected pos 704 vs 598"), so the reason is asked of the folder again: a MiB written
        and removed there."""
        if not self.is_complete(path):
            shutil.rmtree(path, ignore_errors=True)
        probe = self.root / f".space-probe-{os.getpid()}"
        try:
            with probe.open("wb") as fh:
                fh.write(bytes(1 << 20))
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as probed:
            exc = probed
        finally:
            probe.unlink(missing_ok=True)
        return write_failed(path, exc, "the checkpoint")

    def recorded_owner(self) -> str | None:
        """The run whose checkpoints the folder holds, as owner.json says (None: no run's yet)."""
        file = self.root / OWNER
        if not file.is_file():
            return None
        try:
            found = read_json(file).get("run_id")
            if found is not None and not isinstance(found, str):
                raise UserError(f"{file} names run {found!r}, not a run id")
        except UserError as exc:
            raise UserError(f"{exc}; delete it if this folder's checkpoints are no other run's, or pass another "
                            "--checkpoint-dir") from None
        return found or None

    def owner_problem(self) -> str | None:
        """Why this run may not save or resume here (one line, with the fix), or None."""
        found = self.recorded_owner()
        if self.owner is None or found is None or found == self.owner:
            return None
        return (f"checkpoint folder {self.root} holds the checkpoints of run {found}, not of run {self.owner}: a run "
                "saves and resumes only its own; pass another --checkpoint-dir (or none: the run folder's "
                "checkpoints/)")

    def claim(self) -> None:
        """Marks the folder as this run's before its first save (refused if it is another run's)."""
        if self.owner is None:
            return
        problem = self.owner_problem()
        if problem:
            raise UserError(problem)
        if not (self.root / OWNER).is_file():
            self.root.mkdir(parents=True, exist_ok=True)
            write_atomically(self.root / OWNER, json.dumps({"run_id": self.owner}) + "\n")

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
        """The loop position saved with a verified checkpoint."""
        return read_json(path / MARKER)["meta"]

    @staticmethod
    def problem(path: Path) -> str | None:
        """Why the checkpoint at `path` cannot be trusted, or None when every file matches its manifest."""
        try:
            marker = read_json(path / MARKER, MARKER)
            files, meta = marker["files"], marker["meta"]
            if not isinstance(files, dict) or not files or not isinstance(meta, dict) \
                    or not all(isinstance(e, dict) for e in files.values()):
                raise ValueError("no file list")
        except (UserError, ValueError, KeyError, TypeError) as exc:
            return f"its {MARKER} marker is not a scaletrain manifest ({type(exc).__name__}: {exc})"
        for key in POSITION_COUNTS:
            value = meta.get(key)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                return f"its {MARKER} marker gives {key} {value!r}, not a whole number >= 0"
        if not isinstance(meta.get("run_id", ""), str):
            return f"its {MARKER} marker names run {meta['run_id']!r}, not a run id"
        for name, expected in files.items():
            if not isinstance(name, str) or "/" in name or name in (".", ".."):
                return f"its {MARKER} marker names a file outside the checkpoint ({name!r})"
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if file.stat().st_size != expected.get("size"):
                return f"{name} has {file.stat().st_size} bytes, the manifest says {expected.get('size')}"
            if _sha256(file) != expected.get("sha256"):
                return f"{name} does not match its SHA-256 in the manifest"
        return None

    def latest_verified(self) -> Path | None:
        """The newest checkpoint whose files match its manifest; warns about each newer one that
        does not. None when there is no committed checkpoint at all; UserError when there are
        some but none can be trusted."""
        done = self.complete()
        for path in reversed(done):
            problem = self.problem(path)
            if problem is None:
                return path
            print(f"scaletrain: warning: skipping damaged checkpoint {path}: {problem}", file=sys.stderr)
        if done:
            raise UserError(f"no usable checkpoint in {self.root}: all {len(done)} are damaged (see the warnings); "
                            "start a new run (another --run-dir, or --overwrite)")
        return None

    def commit(self, path: Path, meta: dict) -> None:
        """Chief only, after every rank's files are written: records the manifest and makes the
        checkpoint visible."""
        files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
                 for p in sorted(path.iterdir()) if p.is_file() and p.name != MARKER}
        if self.owner is not None:
            meta = {**meta, "run_id": self.owner}
        write_atomically(path / MARKER, json.dumps({"meta": meta, "files": files}, indent=2))
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
