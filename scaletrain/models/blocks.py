"""The model's repeated blocks: the unit of activation checkpointing and of FSDP's sharding.

Deep networks are stacks of one block class (a transformer layer, a residual block). Checkpointing
or sharding per block is what makes memory fall with depth; wrapping every small layer instead
would pay a collective or a recomputation boundary per Linear. Found automatically, or named.
"""

from __future__ import annotations

from collections import defaultdict

from torch import nn

from scaletrain.errors import ConfigError

# Containers hold blocks but are not blocks themselves.
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _outermost(modules: list[nn.Module]) -> list[nn.Module]:
    """Drops modules nested inside another listed one (a block inside a block)."""
    inner = {id(child) for m in modules for child in m.modules() if child is not m}
    return [m for m in modules if id(m) not in inner]


def find_blocks(model: nn.Module, class_names: list[str] | tuple[str, ...] = ()) -> list[nn.Module]:
    """The blocks of `model`, outermost first in module order.

    With `class_names`, every module of those classes. Without, the repeated block class: a
    non-container class with children, instantiated at least twice, that covers the most
    parameters (ties: the more instances). Raises ConfigError when there is none."""
    if class_names:
        wanted = set(class_names)
        blocks = [m for m in model.modules() if type(m).__name__ in wanted and m is not model]
        if not blocks:
            present = sorted({type(m).__name__ for m in model.modules()})
            raise ConfigError(f"no module of class {', '.join(sorted(wanted))} in the model; "
                              f"its classes are: {', '.join(present)}")
        return _outermost(blocks)
    by_class: dict[type, list[nn.Module]] = defaultdict(list)
    for m in model.modules():
        if m is not model and not isinstance(m, _CONTAINERS) and any(True for _ in m.children()):
            by_class[type(m)].append(m)
    candidates = [(sum(_param_count(m) for m in ms), len(ms), cls) for cls, ms in by_class.items() if len(ms) >= 2]
    if not candidates:
        raise ConfigError(f"{type(model).__name__} has no repeated block (a module class used twice or more); "
                          "name the block class with --block-classes")
    _, _, best = max(candidates, key=lambda c: (c[0], c[1]))
    return _outermost(by_class[best])


def pipeline_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """`model` as a sequence of (qualified name, layer) whose composition is its forward: where a
    pipeline may cut. A model states it with a `pipeline_layers()` method (the gpt family does);
    an nn.Sequential is its children. Raises ConfigError for any other model."""
    stated = getattr(model, "pipeline_layers", None)
    if callable(stated):
        return list(stated())
    if isinstance(model, nn.Sequential):
        return list(model.named_children())
    raise ConfigError(f"{type(model).__name__} cannot be cut into pipeline stages: it is not a sequence of layers. "
                      "Give it a pipeline_layers() method returning its (name, layer) pairs in forward order, or "
                      "build it as an nn.Sequential (the gpt models have one)")


def chain(model: nn.Module, *names: str) -> list[tuple[str, nn.Module]]:
    """The layers of `model`'s children `names`, applied one after the other in its forward: an
    nn.Sequential child is its own children (`features.0`, `features.1`, ...), any other child is
    one layer. What a model's `pipeline_layers()` returns when its forward is such a chain."""
    layers = []
    for name in names:
        child = model.get_submodule(name)
        if isinstance(child, nn.Sequential):
            layers += [(f"{name}.{inner}", layer) for inner, layer in child.named_children()]
        else:
            layers.append((name, child))
    return layers


def has_repeated_blocks(model: nn.Module) -> bool:
    try:
        find_blocks(model)
        return True
    except ConfigError:
        return False
