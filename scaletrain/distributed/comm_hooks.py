"""Gradient compression for DDP's all-reduce (seed 002's answer to a saturated interconnect):
each bucket is cast to 16 bits, all-reduced, and cast back, halving the bytes on the wire.

torch's stock bf16 hook refuses anything but NCCL on CUDA; the generic compress hook it wraps
works over gloo too, so CPU runs use that and CUDA runs use the stock hooks.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from scaletrain.errors import ConfigError

COMPRESSIONS = ("none", "bf16", "fp16")


def _bf16_hook(state, bucket):
    return default_hooks._compress_hook(torch.bfloat16, state, bucket)


def _fp16_hook(state, bucket):
    return default_hooks._compress_hook(torch.float16, state, bucket)


def compression_hook(name: str, device: torch.device):
    if name not in COMPRESSIONS:
        raise ConfigError(f"unknown grad_compression '{name}'; choose one of: {', '.join(COMPRESSIONS)}")
    if name == "none":
        return None
    if device.type == "cuda":
        return default_hooks.bf16_compress_hook if name == "bf16" else default_hooks.fp16_compress_hook
    return _bf16_hook if name == "bf16" else _fp16_hook
