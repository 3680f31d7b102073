"""Tensor-core alignment advice (seeds 001 and 004): fp16/bf16 matmuls and convolutions run on
tensor cores at full speed when their dimensions are multiples of 8; other sizes are padded or
fall back to slower kernels. Checked once per run, before training, under a 16-bit precision."""

from __future__ import annotations

from torch import nn

from scaletrain.precision.policies import get_policy

ALIGN = 8


def nearest_multiple(value: int, multiple: int = ALIGN) -> int:
    """The nearest multiple (upwards on a tie, never 0)."""
    down = value // multiple * multiple
    up = down + multiple
    return up if down == 0 or up - value <= value - down else down


def alignment_warnings(model: nn.Module, precision: str, per_device_batch: int) -> list[str]:
    """One line per misaligned size: the batch, and each Linear's features and each convolution's
    channels (input channels of 4 or fewer are the data's own, e.g. RGB, and are left alone)."""
    if not get_policy(precision).computes_in_16_bit:
        return []
    out = []
    if per_device_batch % ALIGN:
        out.append(f"batch size {per_device_batch} per device is not a multiple of {ALIGN} (tensor cores under "
                   f"{precision}); {nearest_multiple(per_device_batch)} would be")
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            dims = [("in_features", module.in_features), ("out_features", module.out_features)]
        elif isinstance(module, nn.modules.conv._ConvNd):
            dims = [("in_channels", module.in_channels), ("out_channels", module.out_channels)]
            dims = [(k, v) for k, v in dims if not (k == "in_channels" and v <= 4)]
        else:
            continue
        bad = [f"{k} {v} (nearest good value {nearest_multiple(v)})" for k, v in dims if v % ALIGN]
        if bad:
            out.append(f"layer {name} ({type(module).__name__}): {', '.join(bad)} is not a multiple of {ALIGN} "
                       f"for tensor cores under {precision}")
    return out
