"""Data sets by name. Each module of this package registers the data sets it reads
(`@register_dataset`, source.py) and is imported when a name it declares is asked for
(registry.py), so a new data set is one decorated loader in one new file."""

from __future__ import annotations

from typing import NamedTuple

from scaletrain.data.dataset import ArraySplit, Dataset, hold_out_validation, make_dataset
from scaletrain.data.source import DATA_SOURCES, DataSource, home_expanded
from scaletrain.data.user_source import user_source
from scaletrain.tasks import targets_of


def data_source(name: str) -> DataSource:
    """The registered data set `name`, or a user's own `package.module:function` (data/user.py)."""
    return user_source(name) if ":" in name else DATA_SOURCES.get(name)


def sample_shape(cfg) -> tuple[tuple[int, ...], int, str]:
    """(sample shape, model output size, task) of the data set a DataConfig names, without loading
    it where the data set says what they are."""
    return sample_and_example(cfg)[:3]


class DataSample(NamedTuple):
    """What a command that plans (rather than trains) reads off the data set."""
    shape: tuple[int, ...]      # one sample's input shape
    outputs: int                # the model's output size
    task: str                   # the data's task
    example: tuple | None       # its first samples (inputs, targets), or None where the set states its sample
    loader_batch: int | None = None   # the per-process batch a user's training DataLoader fixes


def sample_and_example(cfg) -> DataSample:
    """`sample_shape` and `data_example` (and a user's DataLoader's batch) from one reading of the
    data set."""
    cfg = home_expanded(cfg)
    known = data_source(cfg.name).known_sample(cfg)
    if known is not None:
        return DataSample(*known, None)
    ds = load_dataset(cfg)
    y = ds.examples.y
    outputs = ds.num_classes if targets_of(ds.task).class_outputs else (1 if y.ndim == 1 else y.shape[1])
    return DataSample(ds.input_shape, outputs, ds.task, ds.example, ds.loader_batch)


def data_example(cfg) -> tuple | None:
    """The data set's first samples (inputs, targets), which a planner's example batch is shaped
    like (token ids, several named inputs), or None where the data set states its sample (its
    task's example batch is then the data's: a language model's is tokens). A user's own set is
    read for its first samples."""
    return sample_and_example(cfg)[3]


def load_dataset(cfg, seed: int = 0) -> Dataset:
    """Loads the data set a DataConfig names, with a validation split held out unless it has its
    own, optionally cut to its first `train_subset` samples."""
    cfg = home_expanded(cfg)
    source = data_source(cfg.name)
    ds = source.load(cfg, seed)
    if source.splits_itself:
        return ds
    if ds.val is None:   # a data set with a validation split of its own keeps it
        ds = hold_out_validation(ds, cfg.val_fraction)
    if cfg.train_subset:
        # The statistics stay those of the subset actually trained on.
        sub = ArraySplit(ds.train.x[:cfg.train_subset], ds.train.y[:cfg.train_subset])
        ds = make_dataset(ds.name, sub, ds.test, ds.num_classes, val=ds.val, task=ds.task)
    return ds
