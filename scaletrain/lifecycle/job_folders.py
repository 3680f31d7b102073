"""The folders a cloud job service hands a training through its environment (seed 002's Vertex
AI job; SageMaker's the same way), honoured when set:

    SM_MODEL_DIR / AIP_MODEL_DIR          the finished model (model.pt, summary.json, config.json)
    AIP_CHECKPOINT_DIR                    checkpoints, unless --checkpoint-dir names a folder
    AIP_TENSORBOARD_LOG_DIR               TensorBoard event files (and the tensorboard logger on)
    SM_CHANNEL_TRAINING (or the only
    SM_CHANNEL_*)                         the data folder, unless --data-dir names one

scaletrain writes local paths. Vertex AI mounts Cloud Storage at /gcs/ (its FUSE mount), so a
gs://bucket/path it names is written as /gcs/bucket/path; where that mount is missing the job is
refused before it starts, rather than training into a folder nobody collects.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.errors import ConfigError
from scaletrain.lifecycle.folder import enclosing_run
from scaletrain.lifecycle.paths import check_writable_dir

MODEL_VARS = ("SM_MODEL_DIR", "AIP_MODEL_DIR")
CHECKPOINT_VAR = "AIP_CHECKPOINT_DIR"
TENSORBOARD_VAR = "AIP_TENSORBOARD_LOG_DIR"
CHANNEL_PREFIX = "SM_CHANNEL_"
GCS_MOUNT = "/gcs"
MODEL_FILES = ("model.pt", "summary.json", "config.json")


@dataclass(frozen=True, slots=True)
class JobFolders:
    model_dir: str | None = None
    checkpoint_dir: str | None = None
    tensorboard_dir: str | None = None
    data_dir: str | None = None
    sources: dict = field(default_factory=dict)     # each folder's variable, e.g. {"model_dir": "SM_MODEL_DIR"}

    def describe(self) -> dict[str, str]:
        """What the run's summary shows: folder -> "path (VARIABLE)"."""
        return {name: f"{getattr(self, name)} ({var})" for name, var in self.sources.items()}


def _local(var: str, value: str, gcs_mount: str) -> str:
    if value.startswith("gs://"):
        if not os.path.isdir(gcs_mount):
            raise ConfigError(f"{var} is {value}, a Cloud Storage address, and {gcs_mount}/ (Vertex AI's Cloud "
                              f"Storage mount) is not here; scaletrain writes local folders: set {var} to a local "
                              "path or mount the bucket")
        return f"{gcs_mount}/{value[len('gs://'):]}"
    if "://" in value:
        raise ConfigError(f"{var} is {value}; scaletrain writes local folders (or gs:// under {gcs_mount}/): "
                          f"set {var} to a local path")
    return value


def job_folders(environ=os.environ, gcs_mount: str = GCS_MOUNT) -> JobFolders:
    """The job's folders, each one a run writes checked writable now (one line naming the variable)."""
    found: dict[str, str] = {}
    sources: dict[str, str] = {}
    model_var = next((v for v in MODEL_VARS if environ.get(v)), None)
    if model_var:
        found["model_dir"], sources["model_dir"] = _local(model_var, environ[model_var], gcs_mount), model_var
    for name, var in (("checkpoint_dir", CHECKPOINT_VAR), ("tensorboard_dir", TENSORBOARD_VAR)):
        if environ.get(var):
            found[name], sources[name] = _local(var, environ[var], gcs_mount), var
    for name in ("model_dir", "tensorboard_dir"):     # written at the end: found unwritable now, not then
        if name in found:
            check_writable_dir(found[name], sources[name])
    if "model_dir" in found and (owner := enclosing_run(Path(found["model_dir"]).resolve())) is not None:
        raise ConfigError(f"{sources['model_dir']} {found['model_dir']} is in the folder of run {owner.run_id or '?'} "
                          f"({owner.path}): the finished model's files would be written over that run's; set "
                          f"{sources['model_dir']} to a folder of its own")
    channels = sorted(v for v in environ if v.startswith(CHANNEL_PREFIX) and environ[v])
    channel = (f"{CHANNEL_PREFIX}TRAINING" if f"{CHANNEL_PREFIX}TRAINING" in channels
               else channels[0] if len(channels) == 1 else None)
    if channel:
        found["data_dir"], sources["data_dir"] = environ[channel], channel
    return JobFolders(**found, sources=sources)


def apply_job_folders(cfg, folders: JobFolders) -> JobFolders:
    """Fills the config's folders the user left unset from the job's, and turns the tensorboard
    logger on where the job gave it a folder. Returns the folders in effect (for the summary).
    Applying it again (the launcher, then each worker) changes nothing more."""
    used = dict(folders.sources)
    for name, section, key in (("checkpoint_dir", cfg.checkpoint, "dir"), ("data_dir", cfg.data, "data_dir")):
        given = getattr(folders, name)
        if given and getattr(section, key) is None:
            setattr(section, key, given)
        elif given and getattr(section, key) != given:    # the user's own folder wins
            used.pop(name)
    if folders.tensorboard_dir and "tensorboard" not in cfg.tracking.loggers:
        cfg.tracking.loggers = [*cfg.tracking.loggers, "tensorboard"]
    kept = {name: getattr(folders, name) for name in used}
    return JobFolders(**kept, sources=used)


def deliver_model(folders: JobFolders, run_dir: Path) -> None:
    """Copies the finished run's model files into the job's model folder (each appears whole)."""
    if not folders.model_dir:
        return
    target = Path(folders.model_dir)
    target.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        source = run_dir / name
        if source.is_file():
            tmp = target / f".{name}.tmp"
            shutil.copyfile(source, tmp)
            tmp.replace(target / name)
