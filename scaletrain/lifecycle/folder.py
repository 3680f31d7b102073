"""The files of one run folder, and what they say about the run.

    <run folder>/
        .lock            held while a training uses the folder (lock.py)
        run.json         id, status (running/finished/failed/interrupted/pruned), created, launch identity,
                         the SHA-256 of config.json's configuration (a hand edit is refused), this
                         machine's seal of both (user_code/trust.py: a copied folder's code is not
                         imported without --trust-code); padded
                         to 4 KiB, so its status is rewritten in place where a full disk refuses a
                         new file (checkpoint/space.py)
        run_id           the id alone, for shells (`cat run_id`)
        config.json      the full configuration, written when the run starts: resume reads it
        metrics.jsonl    per-epoch metrics (or metrics.csv)
        checkpoints/     committed DCP checkpoints (checkpoint/store.py)
        model.pt         the final weights, a plain state dict (written first at the end)
        summary.json     the run summary (written last)
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from scaletrain.checkpoint.space import overwrite_in_place, padded
from scaletrain.checkpoint.store import write_atomically
from scaletrain.config import config_digest
from scaletrain.errors import UserError, WriteFailed
from scaletrain.files import read_json
from scaletrain.lifecycle.lock import LOCK_FILE
from scaletrain.user_code.trust import check_saved_code, seal

CONFIG, META, RUN_ID, SUMMARY, MODEL = "config.json", "run.json", "run_id", "summary.json", "model.pt"
MODEL_STEM = "model."       # model.pt, and its exports beside it (model.pt2, model.onnx)
# What an experiment (multi, sweep, tune) writes into a run's folder before the run starts: the
# run's config, re-runnable with --config, and its log (experiments/jobs.py).
JOB_FILES = ("config.toml", "train.log")
EVALUATIONS = "evaluations.jsonl"   # a sidecar evaluator's results, one line per checkpoint
# What a run leaves in its folder; any of these means the folder holds a run.
RUN_FILES = (CONFIG, META, RUN_ID, SUMMARY, MODEL, "metrics.jsonl", "metrics.csv", "checkpoints", "tensorboard",
             EVALUATIONS, "mlflow.db", "mlflow-artifacts", "wandb")   # the last three: trackers (tracking/loggers)


class RunFolder:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    def holds_run(self) -> bool:
        return self.path.is_dir() and any((self.path / name).exists() for name in RUN_FILES)

    def foreign_entries(self) -> list[str]:
        """What the folder holds that no run writes (sorted): a run is started only in a folder
        where this is empty, so a folder holding anything else (a home, a project, `/`) is
        never taken for a run's, whatever stray run file lies in it. A run's own are its files,
        its lock, the dot-files of its atomic writes and reservations, the exports of its model
        (`model.pt2`, `model.onnx`) and an experiment's JOB_FILES."""
        try:
            names = [p.name for p in self.path.iterdir()] if self.path.is_dir() else []
        except OSError:
            return []          # unreadable: check_writable_dir names it
        return sorted(n for n in names if n not in RUN_FILES + JOB_FILES and n != LOCK_FILE
                      and not n.startswith((".", MODEL_STEM)))

    def is_run_folder(self) -> bool:
        return self.holds_run() and not self.foreign_entries()

    def _read_json(self, name: str) -> dict | None:
        file = self.path / name
        if not file.is_file():
            return None
        try:
            return read_json(file)
        except UserError as exc:
            raise UserError(f"{exc}; the run folder is damaged: pass another --run-dir, or --overwrite to start "
                            "afresh there") from None

    def config(self) -> dict | None:
        """The configuration the run runs with (None: not recorded), checked against the digest
        run.json keeps: a hand-edited config.json is refused, never continued as if it had run."""
        config = self._read_json(CONFIG)
        expected = self.meta().get("config_sha256") if config is not None else None
        if expected and config_digest(config) != expected:
            raise UserError(f"{self.path / CONFIG} was changed after run {self.run_id or '?'} started (its SHA-256 "
                            f"differs from the one {META} keeps); a run continues only with the configuration it ran "
                            "with: undo the edit, or start a new run with the new settings (another --run-dir, or "
                            "--overwrite)")
        return config

    def trusted_config(self, named: list[str] | tuple[str, ...] = ()) -> dict | None:
        """`config()`, for a command that will import the code it names: refused (one line) where
        that code is neither sealed by this machine, nor `named` on the command line, nor trusted
        by the user (user_code/trust.py)."""
        config = self.config()
        if config is not None:
            meta = self.meta()
            check_saved_code(config, self.path, run_id=meta.get("run_id"), config_sha256=config_digest(config),
                             given_seal=meta.get("code_seal"), named=named)
        return config

    def meta(self) -> dict:
        meta = self._read_json(META) or {}
        wrong = [k for k in ("run_id", "status", "config_sha256") if k in meta and not isinstance(meta[k], str)]
        if wrong:
            raise UserError(f"{self.path / META} holds {wrong[0]} {meta[wrong[0]]!r}, not text; the run folder is "
                            "damaged: pass another --run-dir, or --overwrite to start afresh there")
        if "run_id" not in meta and (self.path / RUN_ID).is_file():
            meta["run_id"] = (self.path / RUN_ID).read_text().strip()  # folders written before run.json
        return meta

    @property
    def run_id(self) -> str | None:
        return self.meta().get("run_id") or None

    @property
    def status(self) -> str | None:
        return self.meta().get("status")

    def start(self, run_id: str, config: dict, launch: dict) -> None:
        """Records a run as running: its id, launch identity and configuration."""
        meta = self.meta() if self.holds_run() else {}
        now = time.time()
        digest = config_digest(config)
        meta.update({"run_id": run_id, "status": "running", "updated_at": now, "launch": launch,
                     "config_sha256": digest, "code_seal": seal(run_id, digest)})
        meta.setdefault("created_at", now)
        # The configuration first, then run.json, which binds it (its digest) and says the run is running.
        write_atomically(self.path / CONFIG, json.dumps(config, indent=2))
        self._write_meta(meta)
        write_atomically(self.path / RUN_ID, run_id + "\n")

    def set_status(self, status: str) -> None:
        meta = self.meta()
        meta.update({"status": status, "updated_at": time.time()})
        self._write_meta(meta)

    def _write_meta(self, meta: dict) -> None:
        """run.json, atomically; on a disk with no room for the new copy, over the old one's bytes
        (it is written padded, so every status fits): a run's ending is recorded whatever the disk."""
        text = padded(json.dumps(meta, indent=2))
        try:
            write_atomically(self.path / META, text)
        except WriteFailed as failed:
            try:
                overwrite_in_place(self.path / META, text)
            except OSError:
                raise failed from None        # no run.json yet, or it does not fit: the atomic write's reason

    def clear(self) -> None:
        """--overwrite: deletes the run's files (not the lock, nor files that are not a run's)."""
        for name in RUN_FILES:
            target = self.path / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()

    def remove_if_unused(self) -> None:
        """Deletes a folder this process created for a run that never trained."""
        if self.path.is_dir() and all(p.name in RUN_FILES + (LOCK_FILE,) for p in self.path.iterdir()):
            shutil.rmtree(self.path, ignore_errors=True)


def enclosing_run(path: Path) -> RunFolder | None:
    """The run folder `path` lies in (or is), by its run.json or run_id file; None: no run's. A
    folder that holds more than a run's files is no run's (`foreign_entries`): a stray run.json in
    `/` or a home folder does not make every path below it another run's."""
    for candidate in (path, *path.parents):
        if ((candidate / META).is_file() or (candidate / RUN_ID).is_file()) and RunFolder(candidate).is_run_folder():
            return RunFolder(candidate)
    return None
