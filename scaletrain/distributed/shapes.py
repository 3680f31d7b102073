"""One shape agreed by every process. A gather or a sum all-reduce needs equal shapes on every
rank, and a process may hold nothing to contribute (a replica whose range has no samples) or
hold a tensor shaped otherwise; each learns the others' shape in one max all-reduce."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

MAX_DIMS = 8   # one encoded shape is 1 + MAX_DIMS numbers: its rank, then its dimensions padded with zeros


def agreed_shape(shape: Sequence[int] | None, all_reduce_max_: Callable[[torch.Tensor], torch.Tensor],
                 device: torch.device | str) -> tuple[int, ...]:
    """The largest rank and, dimension by dimension, the largest size over every process.
    `shape` is None where this process holds nothing (it contributes zeros); `all_reduce_max_`
    reduces in place among the processes that agree (a strategy's or a group's)."""
    encoded = torch.zeros(1 + MAX_DIMS, dtype=torch.float64, device=device)   # float64: exact for any size
    if shape is not None:
        if len(shape) > MAX_DIMS:
            raise ValueError(f"a shape of {len(shape)} dimensions cannot be agreed; at most {MAX_DIMS} can")
        encoded[0] = len(shape)
        encoded[1:1 + len(shape)] = torch.tensor(list(shape), dtype=torch.float64)
    all_reduce_max_(encoded)
    values = encoded.tolist()
    return tuple(int(d) for d in values[1:1 + int(values[0])])
