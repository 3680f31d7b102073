"""Fully sharded data parallelism (ZeRO-3, seed 004) with FSDP2's `fully_shard`, and its ZeRO-2
variant.

Every repeated block becomes one FSDP unit, then the root takes the rest (embeddings, head):
each unit's parameters are all-gathered just before its forward (and again before its backward),
its gradients reduce-scattered right after its backward, so at rest a rank holds 1/N of the
parameters, gradients and optimizer state, and communication overlaps the neighbouring blocks'
compute. `zero2` keeps each unit's gathered parameters from the forward to the backward
(`reshard_after_forward=False`): one all-gather per step instead of two, for the memory of the
unsharded parameters during the step; gradients and optimizer state stay sharded.

With --cpu-offload (FSDP2's `CPUOffloadPolicy`) the shards live in host memory: each unit's shard
is copied to the device for its all-gather, its reduce-scattered gradient copied back, and the
optimizer steps on the host. The device then holds only what the step computes with.

Mixed precision is FSDP's own policy, which the precision policy derives from --precision
(`PrecisionPolicy.sharded`): parameters are gathered in the autocast dtype (half the all-gather
bytes), gradients reduced in float32 (or in 16 bits with --grad-compression), and the sharded
master weights and optimizer state stay float32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard

from scaletrain.distributed.state_bytes import ModelState, ParamInfo, StateBytes, shard_numel
from scaletrain.distributed.strategies.base import register_strategy
from scaletrain.distributed.strategies.process_group import ProcessGroupStrategy
from scaletrain.errors import ConfigError
from scaletrain.models.blocks import find_blocks
from scaletrain.precision import get_policy


@register_strategy("fsdp")
class FSDPStrategy(ProcessGroupStrategy):
    # Its reduce-scatter in 16 bits (the MixedPrecisionPolicy's reduce_dtype); no comm hook.
    grad_compressions = ("none", "bf16", "fp16")
    traffic = "sharded"
    replicated_gradients = False
    forward_communicates = True
    reshard_after_forward = True
    zero_stage = 3
    # Parameters gathered in the forward and again in the backward, gradients reduce-scattered;
    # the next unit's gather is prefetched while the current one computes, forward and backward.
    collectives = (("all_gather", 2, True), ("reduce_scatter", 1, True))   # forward, backward; gradients
    hides_behind = "step"

    def __init__(self, config, env, layout=None):
        super().__init__(config, env, layout)
        self.mesh = None    # the device mesh FSDP shards over (None: every rank; a 2-D mesh replicates across groups)

    @classmethod
    def shard_group(cls, config, devices: int) -> int:
        """How many of `devices` one parameter is sharded over (the planner's view)."""
        return devices

    @classmethod
    def model_problem(cls, model, layout, config, block_classes=()) -> str | None:
        if config.sync_batchnorm:
            return f"--sync-batchnorm is not supported with --strategy {cls.name}; use --strategy ddp"
        if block_classes:
            try:
                find_blocks(model, block_classes)
            except ConfigError as exc:
                return f"--block-classes: {exc}"
        return None

    @classmethod
    def step_collectives(cls, blocks: int) -> tuple:
        if blocks:
            return cls.collectives
        # No block to shard by: the whole model is one unit, the root (wrap below), which keeps its
        # gathered parameters from the forward to the backward under fsdp too. So one all-gather
        # before the forward and one reduce-scatter after the whole backward, with no other unit's
        # compute to prefetch behind or to reduce beside: nothing hides (a profile of the shaped-links
        # MLP under fsdp and zero2 shows exactly these two per step).
        return (("all_gather", 1, False), ("reduce_scatter", 1, False))

    def wrap(self, model: nn.Module, compile_fn, block_classes=(), policy=None):
        problem = self.model_problem(model, self.layout, self.config, block_classes)
        if problem:
            raise ConfigError(problem)
        policy = policy or get_policy("fp32")
        mp, fp32 = policy.sharded(self.config.grad_compression), policy.sharded_float32()
        shard = {"mesh": self.mesh, "reshard_after_forward": self.reshard_after_forward,
                 "offload_policy": self._offload_policy()}
        try:
            blocks = find_blocks(model, block_classes)
        except ConfigError:
            if block_classes:
                raise
            blocks = []  # no repeated block: the whole model is one unit (still sharded at rest)
        # Inner units first (fully_shard goes bottom-up). Modules pinned to float32
        # (--fp32-modules) are their own units with a float32 policy.
        # Batch norm too, under a 16-bit gather: its running statistics stay float32 buffers, which
        # batch_norm refuses beside bf16 weights ("expected scalar type BFloat16 but found Float",
        # found by the GPU kit's smoke part); FSDP1 kept batch norm in float32 by default for this.
        low_gather = mp.param_dtype not in (None, torch.float32)
        norm = policy.sharded_float32(cast_inputs=False)
        for module in model.modules():
            if module is model:
                continue
            if getattr(module, "_scaletrain_float32", False):
                fully_shard(module, mp_policy=fp32, **shard)
            elif low_gather and isinstance(module, nn.modules.batchnorm._BatchNorm):
                fully_shard(module, mp_policy=norm, **shard)
        for block in blocks:
            fully_shard(block, mp_policy=mp, **shard)
        # The root's parameters are needed again first thing in the backward: keep them gathered.
        fully_shard(model, mp_policy=mp, **{**shard, "reshard_after_forward": False})
        forward = compile_fn(model)
        self.model = model
        return forward, forward

    def make_optimizer(self, optim_config, model: nn.Module, device: torch.device, capturable: bool = False):
        # Offloaded shards are stepped where they live: the fused kernels want the LR there too.
        host = torch.device("cpu") if self.offloads(self.config) else device
        return super().make_optimizer(optim_config, model, host, capturable=capturable and host == device)

    def describe(self) -> str | None:
        if not self.offloads(self.config):
            return None
        return "parameter, gradient and optimizer shards in host memory (--cpu-offload); the optimizer steps there"

    def _offload_policy(self) -> OffloadPolicy:
        if not self.offloads(self.config):
            return OffloadPolicy()
        # Pinned host memory makes the copies asynchronous, but pinning needs an accelerator.
        return CPUOffloadPolicy(pin_memory=self.device.type == "cuda")

    def evaluate(self, batches, forward, pad_input=None):
        yield from super().evaluate(batches, forward, pad_input)
        # Units that keep their gathered parameters after a forward (the root; every unit under
        # zero2) are normally resharded by their backward. After forwards without one, reshard
        # them here: an in-place write to the shards (snapshot restore, checkpoint load, the
        # next optimizer step) would otherwise leave a stale gathered copy in use.
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    @classmethod
    def model_state(cls, params: list[ParamInfo], devices: int, b: StateBytes, config=None) -> ModelState:
        devices = cls.shard_group(config, devices)
        total = sum(p.numel for p in params)
        shard = sum(shard_numel(p.shape, devices) for p in params)
        if not cls.reshard_after_forward:
            gathered = total * b.compute   # zero2: the whole model, from each forward to its backward
        else:
            units: dict[int, int] = {}
            for p in params:
                units[p.unit] = units.get(p.unit, 0) + p.numel
            # The root's parameters stay gathered for the whole step; of the blocks, the one
            # running and the one prefetched (the two largest bound it).
            blocks = sorted((n for u, n in units.items() if u >= 0), reverse=True)
            gathered = (units.get(-1, 0) + sum(blocks[:2])) * b.compute
        state = ModelState(total, shard * b.storage, shard * b.storage,
                           shard * b.storage * b.optimizer_slots + len(params) * b.step_bytes, gathered)
        return state.offloaded() if cls.offloads(config) else state

    @classmethod
    def offloads(cls, config) -> bool:
        """Whether this strategy keeps its shards on the host under `config` (--cpu-offload)."""
        return config is not None and config.fsdp.cpu_offload and type(config).reads("fsdp", cls.name)

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        # Gathered shard by shard onto the host of rank 0 (the others get an empty dict).
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


@register_strategy("zero2")
class Zero2Strategy(FSDPStrategy):
    zero_stage = 2
    reshard_after_forward = False
    collectives = (("all_gather", 1, True), ("reduce_scatter", 1, True))   # the backward reuses the forward's gather
