"""Dividing a model's tensors or layers over processes.

`partition_by_size`: whole tensors over ranks, balanced by size (ZeRO-1's optimizer-state owners,
the parameter servers' shards). `stage_layers`: a model cut into pipeline stages, contiguous runs
of its layers (models/blocks.py's `pipeline_layers`), balanced by what each layer costs (its
FLOPs and memory for the run's micro-batch: models/layer_costs.py) or cut where the user names.

Balancing is the linear-partition problem: split a sequence of sizes into k contiguous groups so
the largest group is as small as possible (the slowest stage sets a pipeline's pace). Exact by
dynamic programming; a model has tens of layers, so this costs nothing.
"""

from __future__ import annotations

from itertools import pairwise

from torch import nn

from scaletrain.errors import ConfigError
from scaletrain.models.blocks import pipeline_layers
from scaletrain.models.layer_costs import LayerCost

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
    prefix = _prefix(sizes)
    return balanced_cuts(len(sizes), parts, lambda j, i: prefix[i] - prefix[j])


def cost_balanced_starts(costs: list[LayerCost], parts: int) -> list[int]:
    """Stage starts that balance the layers' FLOPs (the busiest stage sets a pipeline's pace) and,
    among cuts whose busiest stage is as fast, balance memory (parameter state plus one
    micro-batch's saved activations): the largest (FLOPs, memory) pair, compared in that order,
    is the smallest possible."""
    flops, memory = _prefix([c.flops for c in costs]), _prefix([c.memory_bytes for c in costs])
    return balanced_cuts(len(costs), parts, lambda j, i: (flops[i] - flops[j], memory[i] - memory[j]))


def balanced_cuts(n: int, parts: int, group_cost) -> list[int]:
    """The first index of each of `parts` contiguous, non-empty groups of n items whose largest
    `group_cost(j, i)` (of items j..i-1; growing as a group grows) is the smallest possible (ties:
    the earliest cuts)."""
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} items into {parts} non-empty groups")
    # best[k][i]: the smallest largest-group cost splitting the first i items into k groups
    # (None: not yet known). Costs only need an order: numbers, or tuples compared in turn.
    best: list[list] = [[None] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i) if k > 1 else (0,):
                cost = group_cost(j, i)
                value = cost if k == 1 else max(best[k - 1][j], cost)
                if best[k][i] is None or value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    starts, i = [], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        starts.append(i)
    return starts[::-1]


def _prefix(values: list[int]) -> list[int]:
    prefix = [0]
    for v in values:
        prefix.append(prefix[-1] + v)
    return prefix


def stage_layers(model: nn.Module, parts: int, split_points: list[str] = (),
                 costs: list[LayerCost] | None = None) -> list[list[Layer]]:
    """The model's layers cut into `parts` stages: at `split_points` (the names of the layers that
    begin stages 2, 3, ...), else balanced by `costs` (each layer's FLOPs and memory: models/
    layer_costs.py), else by parameter count (enough to check that a cut exists)."""
    layers = pipeline_layers(model)
    names = [name for name, _ in layers]
    if parts > len(layers):
        raise ConfigError(f"{type(model).__name__} has {len(layers)} layers ({', '.join(names)}); it cannot be cut "
                          f"into {parts} pipeline stages; use fewer --stages (or virtual stages)")
    if split_points:
        unknown = [p for p in split_points if p not in names]
        if unknown:
            raise ConfigError(f"--split-points: no layer named {', '.join(unknown)}; the layers are: "
                              f"{', '.join(names)}")
        starts = [0, *(names.index(p) for p in split_points)]
        if any(b <= a for a, b in pairwise(starts)):
            raise ConfigError(f"--split-points {', '.join(split_points)} must name layers in forward order, after "
                              f"the first layer ({names[0]}), each once")
    elif costs is not None:
        if [c.name for c in costs] != names:
            raise ValueError("layer costs were measured for another layer sequence")
        starts = cost_balanced_starts(costs, parts)
    else:
        starts = balanced_starts([sum(p.numel() for p in layer.parameters()) for _, layer in layers], parts)
    ends = [*starts[1:], len(layers)]
    return [layers[a:b] for a, b in zip(starts, ends, strict=True)]


def describe_stages(stages: list[list[Layer]], costs: list[LayerCost] | None = None) -> str:
    """One line: each stage's layers and parameter count (and share of the FLOPs, where measured)."""
    def span(group: list[Layer]) -> str:
        first, last = group[0][0], group[-1][0]
        return first if first == last else f"{first}..{last}"
    flops = {c.name: c.flops for c in costs or ()}
    total = max(sum(flops.values()), 1)

    def share(group: list[Layer]) -> str:
        return f", {sum(flops[name] for name, _ in group) / total:.0%} of FLOPs" if flops else ""
    return "; ".join(f"stage {i}: {span(g)} ({sum(p.numel() for _, m in g for p in m.parameters()) / 1e6:.2f}M"
                     f"{share(g)})" for i, g in enumerate(stages))
