"""Dividing a model's tensors or layers over processes.

`partition_by_size`: whole tensors over ranks, balanced by size (ZeRO-1's optimizer-state owners,
the parameter servers' shards). `stage_layers`: a model cut into pipeline stages, contiguous runs
of its layers (models/blocks.py's `pipeline_layers`), balanced by parameter count or cut where the
user names.

Balancing is the linear-partition problem: split a sequence of sizes into k contiguous groups so
the largest group is as small as possible (the slowest stage sets a pipeline's pace). Exact by
dynamic programming; a model has tens of layers, so this costs nothing.
"""

from __future__ import annotations

from torch import nn

from scaletrain.errors import ConfigError
from scaletrain.models.blocks import has_repeated_blocks, pipeline_layers

Layer = tuple[str, nn.Module]


def partition_by_size(sizes: list[int], parts: int) -> list[int]:
    """The owner (0 .. parts-1) of each item, given by size: largest first, each to the part with
    the least so far (ties: the lowest). Deterministic, so every rank (and the memory planner)
    computes the same owners; it is torch's ZeroRedundancyOptimizer's greedy partition."""
    loads = [0] * parts
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        part = min(range(parts), key=lambda r: loads[r])
        owners[i] = part
        loads[part] += sizes[i]
    return owners


def balanced_starts(sizes: list[int], parts: int) -> list[int]:
    """The first index of each of `parts` contiguous, non-empty groups of `sizes` whose largest
    sum is the smallest possible (ties: the earliest cuts)."""
    n = len(sizes)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} items into {parts} non-empty groups")
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)
    inf = float("inf")
    # best[k][i]: the smallest largest-group sum splitting the first i items into k groups.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    starts, i = [], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        starts.append(i)
    return starts[::-1]


def stage_layers(model: nn.Module, parts: int, split_points: list[str] = ()) -> list[list[Layer]]:
    """The model's layers cut into `parts` stages: at `split_points` (the names of the layers that
    begin stages 2, 3, ...), or balanced by parameter count over a model with repeated blocks."""
    layers = pipeline_layers(model)
    names = [name for name, _ in layers]
    if parts > len(layers):
        raise ConfigError(f"{type(model).__name__} has {len(layers)} layers ({', '.join(names)}); it cannot be cut "
                          f"into {parts} pipeline stages; use fewer --stages (or virtual stages)")
    if split_points:
        unknown = [p for p in split_points if p not in names]
        if unknown:
            raise ConfigError(f"--split-points: no layer named {', '.join(unknown)}; the layers are: {', '.join(names)}")
        starts = [0, *(names.index(p) for p in split_points)]
        if any(b <= a for a, b in zip(starts, starts[1:])):
            raise ConfigError(f"--split-points {', '.join(split_points)} must name layers in forward order, after "
                              f"the first layer ({names[0]}), each once")
    else:
        if not has_repeated_blocks(model):
            raise ConfigError(f"{type(model).__name__} has no repeated blocks to balance pipeline stages over; name "
                              f"where stages 2..{parts} begin with --split-points (its layers: {', '.join(names)})")
        starts = balanced_starts([sum(p.numel() for p in layer.parameters()) for _, layer in layers], parts)
    ends = [*starts[1:], len(layers)]
    return [layers[a:b] for a, b in zip(starts, ends)]


def describe_stages(stages: list[list[Layer]]) -> str:
    """One line: each stage's layers and parameter count."""
    def span(group: list[Layer]) -> str:
        first, last = group[0][0], group[-1][0]
        return first if first == last else f"{first}..{last}"
    return "; ".join(f"stage {i}: {span(g)} ({sum(p.numel() for _, m in g for p in m.parameters()) / 1e6:.2f}M)"
                     for i, g in enumerate(stages))
