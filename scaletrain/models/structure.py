"""A model's structure without its memory: the meta build, once a run, and where a builder cannot
be built there, a real one.

Several checks read the model before it trains (its parameter count and shapes, the strategy's
rules, the task it brings, the pipeline's layer costs, the probe's cache key), and build it on the
meta device for that: no parameter is allocated. But a user's builder may compute with tensor
values while it builds (a size from `.item()`, weights it loads, a shape it checks by running a
layer), which the meta device cannot do ("Tensor.item() cannot be called on meta tensors"). The
meta build is an optimisation: such a builder is built for real on the CPU instead, as a hand
loop would build it, and an error it raises there is its own.

Within a run (from `forget_structures`, which a run's boundary calls, to the next), a structure
is built once per key: each asker gets a copy, so a user's builder runs once on the meta device
and once for real.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable

import torch
from torch import nn

_kept: dict[Hashable, nn.Module] = {}      # meta structures by key, this run's
_real_only: set[Hashable] = set()          # keys whose builder the meta device cannot build


def forget_structures() -> None:
    """A run begins: the structures another run's builders gave are not this one's (a notebook
    may have reloaded the builder's module since)."""
    _kept.clear()
    _real_only.clear()


def structure_of(build: Callable[[], nn.Module], key: Hashable | None = None) -> nn.Module:
    """`build()` on the meta device, or (where the builder computes with tensor values) on the CPU.
    `key`: what names the structure (the model, its options and shapes): built once a run."""
    if key is not None and key in _kept:
        try:
            return copy.deepcopy(_kept[key])
        except Exception:   # noqa: BLE001 - a module that cannot be copied is built again
            pass
    if key is None or key not in _real_only:
        try:
            with torch.device("meta"):
                model = build()
        except Exception:   # noqa: BLE001 - the user's builder on a device it was not written for
            if key is not None:
                _real_only.add(key)
        else:
            if key is not None:
                _kept[key] = model
                try:
                    return copy.deepcopy(model)
                except Exception:   # noqa: BLE001
                    _kept.pop(key)
            return model
    return build()


def device_of(model: nn.Module) -> torch.device:
    """Where `structure_of` built `model`: the meta device, or the CPU for a real build."""
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("meta")
