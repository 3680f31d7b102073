"""Fully sharded data parallelism (ZeRO-3, seed 004) with FSDP2's `fully_shard`, and its ZeRO-2
variant.

Every repeated block becomes one FSDP unit, then the root takes the rest (embeddings, head):
each unit's parameters are all-gathered just before its forward (and again before its backward),
its gradients reduce-scattered right after its backward, so at rest a rank holds 1/N of the
parameters, gradients and optimizer state, and communication overlaps the neighbouring blocks'
compute. `zero2` keeps each unit's gathered parameters from the forward to the backward
(`reshard_after_forward=False`): one all-gather per step instead of two, for the memory of the
unsharded parameters during the step; gradients and optimizer state stay sharded.

Mixed precision is FSDP's own policy, derived from --precision: parameters are gathered in the
autocast dtype (half the all-gather bytes), gradients reduced in float32 (or in 16 bits with
--grad-compression), and the sharded master weights and optimizer state stay float32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from scaletrain.distributed.strategies.process_group import ProcessGroupStrategy
from scaletrain.errors import ConfigError
from scaletrain.models.blocks import find_blocks

_REDUCE_DTYPES = {"none": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision_policy(policy, grad_compression: str) -> MixedPrecisionPolicy:
    """FSDP's policy for a scaletrain precision policy (None dtypes: leave as stored)."""
    return MixedPrecisionPolicy(param_dtype=policy.autocast_dtype if policy is not None else None,
                                reduce_dtype=_REDUCE_DTYPES[grad_compression])


class FSDPStrategy(ProcessGroupStrategy):
    name = "fsdp"
    eval_in_lockstep = True
    reshard_after_forward = True

    def prepare(self, model: nn.Module, compile_fn, block_classes=(), policy=None):
        if self.config.sync_batchnorm:
            raise ConfigError(f"--sync-batchnorm is not supported with --strategy {self.name}; use --strategy ddp")
        mp = mixed_precision_policy(policy, self.config.grad_compression)
        try:
            blocks = find_blocks(model, block_classes)
        except ConfigError:
            if block_classes:
                raise
            blocks = []  # no repeated block: the whole model is one unit (still sharded at rest)
        # Inner units first (fully_shard goes bottom-up). Modules pinned to float32
        # (--fp32-modules) are their own units with a float32 policy.
        fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        for module in model.modules():
            if getattr(module, "_scaletrain_float32", False) and module is not model:
                fully_shard(module, mp_policy=fp32, reshard_after_forward=self.reshard_after_forward)
        for block in blocks:
            fully_shard(block, mp_policy=mp, reshard_after_forward=self.reshard_after_forward)
        # The root's parameters are needed again first thing in the backward: keep them gathered.
        fully_shard(model, mp_policy=mp, reshard_after_forward=False)
        forward = compile_fn(model)
        return forward, forward

    def after_evaluation(self, model: nn.Module) -> None:
        # Units that keep their gathered parameters after a forward (the root; every unit under
        # zero2) are normally resharded by their backward. After forwards without one, reshard
        # them here: an in-place write to the shards (snapshot restore, checkpoint load, the
        # next optimizer step) would otherwise leave a stale gathered copy in use.
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def reduce_found_inf_(self, found_inf: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)
        return found_inf

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        # Gathered shard by shard onto the host of rank 0 (the others get an empty dict).
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class Zero2Strategy(FSDPStrategy):
    name = "zero2"
    reshard_after_forward = False
