"""A training as a job of an experiment: its config written as a plain TOML file (re-runnable
with `scaletrain train --config`), its run id and group chosen up front so the experiment can
find its record, and the store settled afterwards when the process died without saying how."""

from __future__ import annotations

import copy
from pathlib import Path

from scaletrain.config import TrainConfig, write_toml
from scaletrain.errors import UserError
from scaletrain.experiments.slots import Finished, Job, scaletrain_argv
from scaletrain.lifecycle.folder import JOB_FILES
from scaletrain.tracking.store import RunRecord, RunStore, new_run_id


def training_job(cfg: TrainConfig, name: str, folder: Path, group: str | None, payload=None,
                 env: dict[str, str] | None = None) -> Job:
    """A job that trains `cfg` with its run folder, config file and log under `folder/name`."""
    cfg = copy.deepcopy(cfg)
    cfg.tracking.run_id = cfg.tracking.run_id or new_run_id()
    cfg.tracking.group = group
    cfg.run_dir = str(folder / name)
    cfg.progress = False
    # An experiment compares its jobs like for like: none measures its own precision (a probe run
    # beside the experiment's other jobs would read their load as its noise); `auto` takes the rule.
    cfg.probe = False
    config_name, log_name = JOB_FILES     # beside the run's own files (lifecycle/folder.py allows them)
    config_path = write_toml(cfg, folder / name / config_name)
    return Job(name=name, argv=scaletrain_argv("train", "--config", str(config_path)),
               log=folder / name / log_name, env=env or {}, payload=(cfg, payload))


def settle(store: RunStore, finished: Finished) -> RunRecord:
    """The job's run record, marked failed when its process ended before recording an end
    (killed, out of host memory, a crash before the store was opened)."""
    cfg: TrainConfig = finished.job.payload[0]
    run_id = cfg.tracking.run_id
    try:
        record = store.get(run_id)
    except UserError:  # the process died before it recorded its start
        record = None
    if record is None or record.status == "running":
        reason = f"exit code {finished.returncode}" + (f": {finished.last_lines()}" if finished.last_lines() else "")
        store.record_failure(run_id, reason, name=finished.job.name, group=cfg.tracking.group)
        record = store.get(run_id)
    return record
