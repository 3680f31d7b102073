"""`scaletrain predict`: a run's predictions for new samples (or one of its splits), computed by
the replicas of a job side by side (seed 002's `predict` under a strategy): each replica predicts
one contiguous range and every process assembles the whole (`Trainer.predict`), equal to one
device's predictions. The chief writes them as a .npy file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from scaletrain.config import TrainConfig
from scaletrain.errors import UserError
from scaletrain.inference.saved import saved_model_path, saved_run_config
from scaletrain.options import from_mapping, merge_mappings, to_mapping
from scaletrain.tracking.store import RunRecord
from scaletrain.training import build_training

SPLITS = ("train", "val", "test")


@dataclass(frozen=True, slots=True)
class Prediction:
    values: torch.Tensor      # every sample's, in every process
    chief: bool               # this process writes them
    processes: int
    replicas: int             # how many ranges the samples were split into
    strategy: str


def read_samples(path: str | Path) -> np.ndarray:
    """Samples from a .npy file, without unpickling (a data file never runs code)."""
    path = Path(path)
    if path.suffix != ".npy" or not path.is_file():
        raise UserError(f"--input {path}: no such .npy file; pass a NumPy array of samples saved with numpy.save")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise UserError(f"--input {path} cannot be read as a NumPy array ({str(exc).splitlines()[0][:120]}); "
                        "pass an array saved with numpy.save") from None


def check_samples(samples: np.ndarray, input_shape: tuple[int, ...], run_id: str) -> None:
    if tuple(samples.shape[1:]) != tuple(input_shape):
        raise UserError(f"--input holds samples of shape {tuple(samples.shape[1:])}; run {run_id} was trained on "
                        f"samples of shape {tuple(input_shape)}")


def input_shape(cfg: TrainConfig) -> tuple[int, ...]:
    """One sample's shape for the model `cfg` trains (without loading the data where the data set knows)."""
    from scaletrain.data.registry import sample_shape
    return tuple(sample_shape(cfg.data)[0])


def prediction_config(record: RunRecord, overrides: dict, data_dir: str | None = None) -> TrainConfig:
    """The run's config with its saved weights, on one process unless `overrides` (the
    command's --nproc, --strategy, strategy options, --device) say otherwise; checked."""
    cfg = saved_run_config(record, data_dir=data_dir)
    cfg.model.init_from = str(saved_model_path(record))
    cfg.eval_each_epoch = False
    cfg = from_mapping(TrainConfig, merge_mappings(to_mapping(cfg), overrides))
    cfg.validate()
    return cfg


def predict_run(cfg: TrainConfig, run_id: str, *, samples: np.ndarray | None = None, split: str | None = None,
                batch_size: int | None = None) -> Prediction:
    """The predictions of the model `cfg` names (`prediction_config`) on `samples` or a split of
    its data set, under its strategy: this process is one of cfg.distributed.nproc (under the
    launcher) or the only one."""
    with build_training(cfg, checked=True) as built:   # (prediction_config checked it)
        trainer, dataset = built.trainer, built.dataset
        trainer.adopt(dataset)
        if samples is not None:
            check_samples(samples, dataset.input_shape, run_id)
        x = samples if samples is not None else dataset.split(split)   # a split: read as evaluation reads it
        layout = built.strategy.layout
        return Prediction(trainer.predict(x, batch_size), layout.is_chief, layout.world, layout.replicas,
                          layout.strategy)
