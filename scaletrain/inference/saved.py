"""A finished run's model, rebuilt from its record: the config it trained with (on one device,
unfused) and its saved weights. `ensemble` and `export` both start here."""

from __future__ import annotations

import copy
from pathlib import Path

from scaletrain.config import TrainConfig, config_digest
from scaletrain.errors import UserError
from scaletrain.lifecycle.folder import MODEL, RunFolder
from scaletrain.options import from_mapping
from scaletrain.tracking.store import RunRecord
from scaletrain.user_code.trust import check_saved_code


def saved_model_path(record: RunRecord) -> Path:
    """The run's model.pt; a one-line error when the run saved none."""
    path = Path(record.run_dir or "?") / MODEL
    if not record.run_dir or not path.is_file():
        raise UserError(f"run {record.id} has no saved model ({path}): it failed, ran with --no-save-model, "
                        "or its folder moved")
    return path


def check_record_code(record: RunRecord, recorded: tuple = ()) -> None:
    """A store's record names code to import only as its run folder's seal allows (a store, like
    a folder, may come from elsewhere): one line otherwise (user_code/trust.py). `recorded`: other
    names of the record a caller will import (an ensemble's summary task)."""
    meta = RunFolder(record.run_dir).meta() if record.run_dir and Path(record.run_dir).is_dir() else {}
    check_saved_code(record.config, f"run {record.id} of the run store", run_id=record.id,
                     config_sha256=config_digest(record.config), given_seal=meta.get("code_seal"),
                     recorded=recorded)


def saved_run_config(record: RunRecord, device: str = "auto", data_dir: str | None = None) -> TrainConfig:
    """The run's config for rebuilding its model here: one process (strategy auto, so a caller
    that sets more processes gets the default data-parallel one), no compile or CUDA graphs (what
    the weights mean does not depend on how the steps ran), the data where it is now."""
    check_record_code(record)
    cfg = from_mapping(TrainConfig, copy.deepcopy(record.config))
    cfg.device, cfg.distributed.strategy, cfg.distributed.nproc = device, "auto", 1   # auto: single on one process
    cfg.distributed.devices = []     # the devices its training used are not this command's
    cfg.compile, cfg.cuda_graphs, cfg.model.init_from = False, False, None
    if data_dir:
        cfg.data.data_dir = data_dir
    return cfg
