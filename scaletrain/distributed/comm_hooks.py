"""How DDP's gradients cross the links (seed 002's `cross_device_ops`: the all-reduce as a choice,
and compression for a saturated interconnect), as DDP communication hooks:

- none: DDP's own bucketed all-reduce, exact;
- bf16 / fp16: each bucket cast to 16 bits, all-reduced, cast back: half the bytes, rounding;
- powersgd: torch's PowerSGD hook (Vogels et al., 2019): each gradient matrix (n x m, a layer's
  weight) is all-reduced as two rank-r factors, r(n + m) numbers instead of nm, with error
  feedback (what a step's approximation missed is added to the next step's gradient); vectors
  (biases, norms) and matrices too small to gain are all-reduced whole. The first
  `powersgd_warmup` steps use the plain all-reduce. `scaletrain scaling` prices the bytes of each.

torch's stock 16-bit hooks refuse anything but NCCL on CUDA; the generic compress hook they wrap
works over gloo too, so CPU runs use that and CUDA runs the stock hooks. PowerSGD's hook works on
both. Its state (error feedback, the warm-started factors) is not checkpointed: a resumed run
starts its warm-up again.
"""

from __future__ import annotations

import logging

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from scaletrain.errors import ConfigError

COMPRESSIONS = ("none", "bf16", "fp16", "powersgd")


def _bf16_hook(state, bucket):
    return default_hooks._compress_hook(torch.bfloat16, state, bucket)


def _fp16_hook(state, bucket):
    return default_hooks._compress_hook(torch.float16, state, bucket)


def register_compression(ddp, config, device: torch.device) -> None:
    """Registers on the DistributedDataParallel `ddp` the hook the DistributedConfig `config`
    chooses (none: DDP's own all-reduce stays)."""
    import torch.distributed as dist
    name = config.grad_compression
    if name not in COMPRESSIONS:
        raise ConfigError(f"unknown grad_compression '{name}'; choose one of: {', '.join(COMPRESSIONS)}")
    if name == "none":
        return
    if name == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        # Its INFO lines (buffers allocated, compression started) would repeat on every rank.
        logging.getLogger(powerSGD_hook.__name__).setLevel(logging.WARNING)
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=config.powersgd_rank,
                                            start_powerSGD_iter=config.powersgd_warmup, random_seed=0,
                                            compression_stats_logging_frequency=2**62)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return
    if device.type == "cuda":
        hook = default_hooks.bf16_compress_hook if name == "bf16" else default_hooks.fp16_compress_hook
    else:
        hook = _bf16_hook if name == "bf16" else _fp16_hook
    ddp.register_comm_hook(dist.group.WORLD, hook)


def powersgd_wire_elements(shapes, rank: int, min_compression_rate: float = 2.0) -> int:
    """The numbers PowerSGD all-reduces per step for gradients shaped `shapes` (torch's rule: a
    tensor viewed as rows x the rest is sent as rank-r factors when that is more than
    `min_compression_rate` times smaller, else whole)."""
    total = 0
    for shape in shapes:
        n = int(shape[0]) if len(shape) else 1
        m = 1
        for d in shape[1:]:
            m *= int(d)
        r = min(n, m, rank)
        compressed = (n + m) * r
        total += compressed if compressed * min_compression_rate < n * m else n * m
    return total
