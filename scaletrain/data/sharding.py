"""Which samples each replica sees.

Training: every rank draws the same seeded permutation of the whole split each epoch; global batch
i is positions [i*G, (i+1)*G) of it, and rank r takes its contiguous slice [i*G + r*b, i*G + (r+1)*b).
So N ranks with per-replica batch b step through exactly the samples one rank with batch N*b would
(the equivalence the tests check), every rank sees a distinct shard, and a resumed run finds its
place from (epoch, step) alone.

Evaluation: rank r takes one contiguous range of the split with no padding, so after the sums are
all-reduced every validation sample has been counted exactly once (DistributedSampler pads by
repeating samples, which double-counts some of them).
"""

from __future__ import annotations

import torch


def rank_positions(steps: int, per_replica: int, rank: int, world_size: int) -> torch.Tensor:
    """Positions in the epoch's permutation that `rank` trains on, step after step."""
    global_batch = per_replica * world_size
    starts = torch.arange(steps) * global_batch + rank * per_replica
    return (starts[:, None] + torch.arange(per_replica)[None, :]).reshape(-1)


def eval_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """The [start, end) range of an n-sample split that `rank` evaluates (sizes differ by at most 1)."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
