"""A run's folder: `plan_run` decides (reading only) which folder a training uses and whether it
starts, resumes or overwrites a run there; `TakenFolder` takes it (lock, id, saved config) and
records how the run ended. The run itself, which tells its folder, the store and the trackers,
is run.py's `Run`.

The rules, in order:
- a torchrun restart continues the folder of the attempt before it (found by its launch identity:
  host, agent pid, rendezvous id), whatever else was asked;
- `--run-dir DIR` that holds no run: a new run there; one that holds a run: `--resume` continues
  it (its saved configuration, see resume.py), `--overwrite` deletes it and starts afresh, and
  anything else is refused with one line naming both;
- no `--run-dir`: `--resume auto` continues the newest run under ./scaletrain-runs whose fixed
  configuration equals this one and that has a complete checkpoint; otherwise a new folder named
  `<time>-<model>-<data>-<precision>-<run id>`: two trainings never share one.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from scaletrain.checkpoint import Checkpointer, CheckpointStore
from scaletrain.config import TrainConfig
from scaletrain.errors import UserError, WriteFailed
from scaletrain.lifecycle.folder import RunFolder, enclosing_run
from scaletrain.lifecycle.lock import FolderLock
from scaletrain.lifecycle.paths import check_writable_dir, check_writable_file
from scaletrain.lifecycle.resume import check_same_run, locked_differences
from scaletrain.options import from_mapping, to_mapping
from scaletrain.tracking.store import RunStore, new_run_id

RUNS_ROOT = Path("scaletrain-runs")


def run_name(cfg: TrainConfig, undecided: Collection[str] = ()) -> str:
    """model-data-precision; `undecided`: the settings a probe may still change after the name is
    taken (a folder is named before its run's probe): such a precision is named `auto`."""
    precision = "auto" if "precision" in undecided else cfg.precision.policy
    return f"{cfg.model.name}-{cfg.data.name}-{precision}".replace("/", "_").replace(":", "_")


def launch_identity(env) -> dict:
    """What stays the same across torchrun's restarts of one job and differs between two jobs:
    the host and the agent process (every worker's parent), and the rendezvous id."""
    return {"host": socket.gethostname(), "agent_pid": os.getppid() if env.under_elastic else None,
            "rdzv_id": env.run_id}


@dataclass(slots=True)
class RunPlan:
    folder: RunFolder
    mode: str                    # "new", "resume" or "overwrite"
    run_id: str

    def describe(self) -> str:
        return {"new": "new run", "resume": "resuming run", "overwrite": "new run (overwriting the folder)"}[self.mode]


def checkpoint_store(cfg: TrainConfig, folder: RunFolder, run_id: str | None = None) -> CheckpointStore:
    """Where the run's checkpoints are kept (its folder's checkpoints/, or --checkpoint-dir), as
    run `run_id`'s (None: only read)."""
    root = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else folder.path / "checkpoints"
    return CheckpointStore(root, keep=cfg.checkpoint.keep, owner=run_id)


def _check_owned_outputs(cfg: TrainConfig, plan: RunPlan) -> None:
    """A run writes only where it owns: no output inside another run's folder, and a checkpoint
    folder that is its own or no run's (checkpoint/store.py's owner.json)."""
    own = plan.folder.path.resolve()
    host = enclosing_run(own.parent)
    if host is not None:
        raise UserError(f"--run-dir {plan.folder.path} is inside the folder of run {host.run_id or '?'} ({host.path}); "
                        "a run's folder holds only that run: pass a --run-dir outside it")
    for path, flag in ((cfg.checkpoint.dir, "--checkpoint-dir"), (cfg.summary_json, "--summary-json")):
        other = enclosing_run(Path(path).resolve()) if path else None
        if other is not None and other.path.resolve() != own:
            raise UserError(f"{flag} {path} is inside the folder of run {other.run_id or '?'} ({other.path}); a run "
                            f"writes only in its own folder or outside every run's: pass another {flag}")
    if cfg.checkpoint.dir:
        problem = checkpoint_store(cfg, plan.folder, plan.run_id).owner_problem()
        if problem:
            raise UserError(problem)


def _check_only_a_runs(folder: RunFolder) -> None:
    """A run writes only into a folder that is new, empty or a run's (resumed or overwritten):
    anything else is refused before anything is written, naming what is there."""
    foreign = folder.foreign_entries()
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UserError(f"--run-dir {folder} already holds files that are not a run's ({shown}); a run writes only "
                        "into a new or empty folder, or its own run folder: pass a --run-dir of its own, e.g. "
                        f"{folder.path / 'run'}")


def _check_resumable(cfg: TrainConfig, folder: RunFolder, unnamed: Collection[str] = ()) -> None:
    saved = folder.config()
    if saved is not None:
        check_same_run(from_mapping(TrainConfig, saved), cfg, folder, unnamed)
    if folder.status == "finished" and not checkpoint_store(cfg, folder).complete():
        raise UserError(f"run {folder.run_id} in {folder} finished and kept no checkpoint to continue from; "
                        "pass --overwrite to start afresh there, or another --run-dir")


def _probe_lock(folder: RunFolder) -> None:
    if folder.path.is_dir():
        lock = FolderLock(folder.path)
        lock.acquire()   # raises RunFolderBusy naming the holder
        lock.release()


def _new_folder(cfg: TrainConfig, run_id: str, undecided: Collection[str]) -> RunFolder:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return RunFolder(RUNS_ROOT / f"{stamp}-{run_name(cfg, undecided)}-{run_id}")


def _candidates() -> list[RunFolder]:
    """Run folders under RUNS_ROOT, newest first."""
    if not RUNS_ROOT.is_dir():
        return []
    found = [RunFolder(p) for p in RUNS_ROOT.iterdir() if p.is_dir()]
    return sorted(found, key=lambda f: f.path.stat().st_mtime, reverse=True)


def _folder_of_launch(env) -> RunFolder | None:
    identity = launch_identity(env)
    for folder in _candidates():
        try:
            if folder.meta().get("launch") == identity:
                return folder
        except UserError:
            continue
    return None


def latest_resumable(cfg: TrainConfig, unnamed: Collection[str] = ()) -> RunFolder | None:
    """The newest run under RUNS_ROOT with the same fixed configuration and a complete checkpoint.
    `unnamed`: fixed keys that the command did not name and that the run may have settled itself
    (the batch a user's DataLoader fixes), whose difference does not tell two runs apart."""
    for folder in _candidates():
        try:
            saved = folder.config()
            if saved is None or locked_differences(from_mapping(TrainConfig, saved), cfg, unnamed):
                continue
        except UserError:
            continue
        if checkpoint_store(cfg, folder).complete():
            return folder
    return None


def resume_source(cfg: TrainConfig, env, unnamed: Collection[str] = ()) -> RunFolder | None:
    """The run folder a training would continue, or None for a new run (see the module doc);
    `unnamed`: as `latest_resumable`'s."""
    if env.restart_count > 0:
        folder = RunFolder(cfg.run_dir) if cfg.run_dir else _folder_of_launch(env)
        if folder is not None and folder.holds_run():
            return folder
    if cfg.run_dir:
        folder = RunFolder(cfg.run_dir)
        return folder if cfg.checkpoint.resume is not None and folder.holds_run() and not cfg.overwrite else None
    return latest_resumable(cfg, unnamed) if cfg.checkpoint.resume == "auto" else None


def check_outputs(cfg: TrainConfig) -> None:
    """Every path the run will write, checked before any work starts."""
    if cfg.summary_json:
        check_writable_file(cfg.summary_json, "--summary-json")
    if cfg.checkpoint.dir:
        check_writable_dir(cfg.checkpoint.dir, "--checkpoint-dir")
    if cfg.tracking.record:
        check_writable_file(cfg.tracking.store, "run store (--store)")


def plan_run(cfg: TrainConfig, env, undecided: Collection[str] = (), unnamed: Collection[str] = ()) -> RunPlan:
    """Decides the run's folder and mode, and checks every output it will write; writes nothing.
    Raises UserError on a conflict. `undecided`: the settings the run's probe may still change
    (a new folder's name does not state them); `unnamed`: as `latest_resumable`'s."""
    plan = _decide_folder(cfg, env, undecided, unnamed)
    _check_owned_outputs(cfg, plan)
    return plan


def _decide_folder(cfg: TrainConfig, env, undecided: Collection[str], unnamed: Collection[str] = ()) -> RunPlan:
    check_outputs(cfg)
    if cfg.run_dir:
        check_writable_dir(cfg.run_dir, "--run-dir")
        _check_only_a_runs(RunFolder(cfg.run_dir))
    else:
        check_writable_dir(RUNS_ROOT, "runs folder")
    source = resume_source(cfg, env, unnamed)
    if source is not None:
        _probe_lock(source)
        if env.restart_count == 0:
            _check_resumable(cfg, source, unnamed)
        if cfg.tracking.run_id and source.run_id and cfg.tracking.run_id != source.run_id:
            raise UserError(f"run folder {source} holds run {source.run_id}; --run-id {cfg.tracking.run_id} names "
                            "another: drop --run-id to continue it")
        return RunPlan(source, "resume", source.run_id or cfg.tracking.run_id or new_run_id())
    run_id = cfg.tracking.run_id or new_run_id()
    if not cfg.run_dir:
        return RunPlan(_new_folder(cfg, run_id, undecided), "new", run_id)
    folder = RunFolder(cfg.run_dir)
    _probe_lock(folder)
    if not folder.holds_run():
        return RunPlan(folder, "new", run_id)
    if cfg.overwrite:
        return RunPlan(folder, "overwrite", run_id)
    raise UserError(f"run folder {folder} already holds run {folder.run_id or '?'} "
                    f"({folder.status or 'status unknown'}); continue it with --resume auto, start afresh there with "
                    "--overwrite (deletes its files), or pass another --run-dir")


class TakenFolder:
    """A run's folder, taken: locked, with the run's id and configuration, and how the run ended."""

    def __init__(self, plan: RunPlan, cfg: TrainConfig, env):
        self.folder, self.mode, self.run_id, self.config = plan.folder, plan.mode, plan.run_id, cfg
        self.path = plan.folder.path
        self.launch = launch_identity(env)
        self.created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock = FolderLock(self.path)
        try:
            self.lock.acquire()
            if self.mode == "overwrite":
                self.folder.clear()
            if not self.resumed:
                self.folder.start(self.run_id, to_mapping(cfg), self.launch)
        except BaseException:
            self.lock.release()
            if self.created:
                self.folder.remove_if_unused()
            raise
        self.began = False     # training began in this process (a resume: its checkpoint loaded)
        self.stepped = False   # ... and ran a step

    @property
    def resumed(self) -> bool:
        return self.mode == "resume"

    def on_train_begin(self, trainer) -> None:
        """A callback hook: a resumed run is marked running (with the configuration it continues
        with) only once its checkpoint has loaded, so a failed resume attempt changes nothing."""
        if self.resumed:
            self.folder.start(self.run_id, to_mapping(self.config), self.launch)
        self.began = True

    def on_train_batch_end(self, trainer, step: int, logs) -> None:
        self.stepped = True

    def finish(self) -> None:
        self.folder.set_status("finished")
        self.lock.release()

    def fail(self, status: str) -> None:
        """Records how the run ended. A new run that ran no step in a folder this process made
        leaves nothing behind (a configuration error, or a bad sample met while streaming the first
        batch, costs no folder); a resume that never began leaves the run as it was."""
        try:
            if self.created and not self.stepped and not self.resumed:
                self.folder.remove_if_unused()
            elif self.began:
                self.folder.set_status(status)
        except WriteFailed:    # a disk still full: run.json keeps "running"; the error being handled says why
            pass
        finally:
            self.lock.release()


def record_job_end(plan: RunPlan, cfg: TrainConfig, status: str, error: str | None = None) -> None:
    """The launcher's word on a job that did not finish, in the run's folder and its store.
    "failed": a worker the agent stopped after another failed recorded the run as interrupted (or
    could not record it at all). "interrupted": a signal stopped the job, and a worker killed
    before its handler ran (blocked in a collective when the agent's grace ran out) left the run
    "running". Likewise "interrupted" replaces "failed": a stopped launcher stops its workers one by
    one, and one whose peer ended first failed in a collective (seen: the launcher SIGTERMed, its
    chief recorded "failed")."""
    stale = ("running", "interrupted") if status == "failed" else ("running", "failed")
    folder = plan.folder
    if folder.holds_run() and folder.status in stale:
        folder.set_status(status)
    if cfg.tracking.record and Path(cfg.tracking.store).is_file():
        with RunStore(cfg.tracking.store) as store:
            if store.exists(plan.run_id) and store.get(plan.run_id).status in stale:
                if status == "failed":
                    store.record_failure(plan.run_id, error)
                else:
                    store.finish_run(plan.run_id, status)


def make_checkpointer(plan: RunPlan, cfg: TrainConfig, env) -> Checkpointer | None:
    """Every rank's checkpointer for the run's folder. A resumed run, and a torchrun restart,
    continue from the newest complete checkpoint."""
    resume = cfg.checkpoint.resume or ("auto" if plan.mode == "resume" or env.restart_count > 0 else None)
    if cfg.checkpoint.every <= 0 and resume is None:
        return None
    return Checkpointer(checkpoint_store(cfg, plan.folder, plan.run_id), every=cfg.checkpoint.every, resume=resume,
                        background=cfg.checkpoint.async_save)
