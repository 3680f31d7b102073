"""Per-module float32 opt-out: the PyTorch form of Keras's per-layer `dtype="float32"`.

Seeds 000 and 004 keep numerically sensitive layers (the final softmax/logits, norms) in float32
under mixed precision. Here the chosen modules get a forward that casts floating inputs to float32
and disables autocast, so they really compute in float32 whatever policy surrounds them. The
module's parameters and state-dict keys are untouched (no wrapper module is inserted).
"""

from __future__ import annotations

import fnmatch
import functools

import torch
from torch import nn
from torch.utils._pytree import tree_map

from scaletrain.errors import ConfigError


def _to_dtype(dtype: torch.dtype):
    def cast(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            return value.to(dtype)
        return value
    return cast


def _float32_forward(original, cast_outputs_to, *args, **kwargs):
    args, kwargs = tree_map(_to_dtype(torch.float32), (args, kwargs))
    device_type = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
    with torch.autocast(device_type=device_type, enabled=False):
        out = original(*args, **kwargs)
    if cast_outputs_to is not None:
        out = tree_map(_to_dtype(cast_outputs_to), out)
    return out


def matching_modules(model: nn.Module, patterns: list[str] | tuple[str, ...]) -> dict[str, nn.Module]:
    """Modules whose qualified name or class name matches a pattern (shell wildcards allowed)."""
    found: dict[str, nn.Module] = {}
    for pattern in patterns:
        hits = {name: mod for name, mod in model.named_modules() if name and (
            fnmatch.fnmatchcase(name, pattern) or type(mod).__name__ == pattern)}
        if not hits:
            names = ", ".join(n for n, _ in list(model.named_children()))
            raise ConfigError(f"precision.fp32_modules entry '{pattern}' matches no module name or class; "
                              f"top-level modules are: {names}")
        found.update(hits)
    # A module nested inside another opted-out module is already covered by its parent.
    return {n: m for n, m in found.items() if not any(n.startswith(p + ".") for p in found if p != n)}


def keep_in_float32(model: nn.Module, patterns, cast_outputs_to: torch.dtype | None = None) -> list[str]:
    """Pins the matching modules to float32; returns their names."""
    chosen = matching_modules(model, patterns)
    for module in chosen.values():
        module.float()
        module.forward = functools.partial(_float32_forward, module.forward, cast_outputs_to)
        module._scaletrain_float32 = True
    return sorted(chosen)
