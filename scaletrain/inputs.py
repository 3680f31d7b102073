"""A batch's inputs: one tensor, or a dict of named tensors (a sample with several inputs, such as
a Hugging Face row's `input_ids` and `attention_mask`). The operations the loaders, the step and
the strategies apply to inputs, written once for both forms."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

Inputs = torch.Tensor | dict[str, torch.Tensor]


def map_inputs(fn: Callable[[torch.Tensor], torch.Tensor], x: Inputs) -> Inputs:
    """`fn` applied to the tensor, or to each tensor of the dict."""
    return {k: fn(v) for k, v in x.items()} if isinstance(x, dict) else fn(x)


def tensors(x: Inputs) -> list[torch.Tensor]:
    return list(x.values()) if isinstance(x, dict) else [x]


def batch_rows(x: Inputs) -> int:
    """Samples in the batch (every input has one row per sample)."""
    return tensors(x)[0].shape[0]


def first_rows(x: Inputs, n: int = 1) -> Inputs:
    return map_inputs(lambda t: t[:n], x)


def chunk_inputs(x: Inputs, k: int) -> list[Inputs]:
    """`x` cut into `k` micro-batches along the batch dimension (as `Tensor.chunk`)."""
    if not isinstance(x, dict):
        return list(x.chunk(k))
    parts = {name: t.chunk(k) for name, t in x.items()}
    return [{name: p[i] for name, p in parts.items()} for i in range(len(next(iter(parts.values()))))]


def call_model(model: Callable | nn.Module, x: Inputs):
    """The model on a batch: its one input positionally, several by name (keyword arguments)."""
    return model(**x) if isinstance(x, dict) else model(x)
