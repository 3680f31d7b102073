"""Synchronous data parallelism with torch's DistributedDataParallel (seeds 000 and 002's
MirroredStrategy / MultiWorkerMirroredStrategy): one replica per process, gradients averaged by
bucketed all-reduce that overlaps the backward pass. NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import contextlib

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scaletrain.distributed.comm_hooks import COMPRESSIONS, register_compression
from scaletrain.distributed.strategies.base import register_strategy
from scaletrain.distributed.strategies.process_group import ProcessGroupStrategy
from scaletrain.distributed.sync_batchnorm import convert_to_global_batchnorm


@register_strategy("ddp")
class DDPStrategy(ProcessGroupStrategy):
    grad_compressions = COMPRESSIONS

    def __init__(self, config, env, layout=None):
        super().__init__(config, env, layout)
        self.ddp: DistributedDataParallel | None = None

    def wrap(self, model: nn.Module, compile_fn, block_classes=(), policy=None):
        if self.config.sync_batchnorm:
            # In place: the trainer's bare model (eval, export) keeps the converted layers.
            model = (nn.SyncBatchNorm.convert_sync_batchnorm(model) if self.device.type == "cuda"
                     else convert_to_global_batchnorm(model))
        self.ddp = DistributedDataParallel(
            model, device_ids=[self.device] if self.device.type == "cuda" else None,
            bucket_cap_mb=self.config.bucket_cap_mb, gradient_as_bucket_view=True)
        register_compression(self.ddp, self.config, self.device)
        # compile(DDP(model)), not DDP(compile(model)): Dynamo's DDPOptimizer then splits the graph
        # at bucket boundaries, so each bucket's all-reduce still overlaps the rest of the backward.
        return compile_fn(self.ddp), compile_fn(model)

    def no_sync(self):
        return self.ddp.no_sync() if self.ddp is not None else contextlib.nullcontext()
