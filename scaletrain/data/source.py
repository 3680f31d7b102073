"""The data-set registry: each data set is one decorated loader, `@register_dataset(NAME)`, in the
module that reads it, found because data/registry.py imports every module of this package.

A loader takes the DataConfig and the run's seed and returns a Dataset. `sample` tells planners
the (sample shape, model outputs, task) without loading anything: a fixed tuple, a function of the
DataConfig, or None (the planner loads the data to find out)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scaletrain.config import DATA_SETS as DATA_SET_CHOICES
from scaletrain.registry import Registry

Sample = tuple[tuple[int, ...], int, str]


@dataclass(frozen=True, slots=True)
class DataSource:
    name: str
    load: Callable[[Any, int], Any]                       # (DataConfig, seed) -> Dataset
    sample: Sample | Callable[[Any], Sample] | None = None
    # True when the loader returns its own validation split and cuts `train_subset` itself.
    splits_itself: bool = False
    # The user's own data (a file, a function): a recipe's target promises nothing about it.
    users_own: bool = False

    def known_sample(self, cfg) -> Sample | None:
        return self.sample(home_expanded(cfg)) if callable(self.sample) else self.sample


def home_expanded(cfg):
    """The DataConfig with a `~` in --data-dir expanded: a quoted pattern ('~/shards/train-{0000..0031}.tar',
    quoted so the shell leaves its braces alone) reaches us unexpanded."""
    if cfg.data_dir and cfg.data_dir.startswith("~"):
        return dataclasses.replace(cfg, data_dir=os.path.expanduser(cfg.data_dir))
    return cfg


DATA_SOURCES = Registry("data set", "--data", choices=DATA_SET_CHOICES)


def register_dataset(name: str, *, sample: Sample | Callable[[Any], Sample] | None = None,
                     splits_itself: bool = False, users_own: bool = False) -> Callable:
    """Decorator on a loader `(cfg, seed) -> Dataset`: makes it available as `--data NAME`."""
    def add(load: Callable) -> Callable:
        DATA_SOURCES.add(name, DataSource(name, load, sample, splits_itself, users_own))
        return load
    return add
