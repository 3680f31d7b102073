"""Hybrid sharded data parallelism (HSDP): FSDP2 on a 2-D device mesh. The job's ranks form groups
of `--shard-size`; within a group every parameter, gradient and optimizer state is sharded as under
fsdp (all-gathers and reduce-scatters inside the group), and the groups are replicas of each other
(gradients all-reduced across groups after the reduce-scatter).

Why: sharding over a whole multi-host job sends every all-gather over the slowest link. Sharding
inside a host (the default group is the processes of one host, torchrun's LOCAL_WORLD_SIZE) keeps
the per-layer traffic on the fast link and crosses hosts once per step, for the memory of
`world / shard_size` copies of the sharded state. torchtitan's `dp_replicate x dp_shard` and
FSDP2's own HSDP (a mesh of shape (replicate, shard)) are the model.

Everything else is fsdp's: the units per repeated block, the precision policy, evaluation, full
weights for export, and DCP checkpoints, which reshard by name onto any other layout.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh

from scaletrain.distributed.strategies.base import register_strategy
from scaletrain.distributed.strategies.fsdp import FSDPStrategy


@register_strategy("hsdp")
class HSDPStrategy(FSDPStrategy):

    @classmethod
    def layout_problem(cls, layout, config) -> str | None:
        shard = config.hsdp.group(layout.world)
        if shard > layout.world or layout.world % shard:
            return (f"--shard-size {shard} does not divide {layout.world} processes into equal groups; use a divisor "
                    f"of {layout.world}")
        return None

    @classmethod
    def shard_group(cls, config, devices: int) -> int:
        shard = config.hsdp.shard_size if config is not None else 0
        return min(shard, devices) if shard else devices

    def setup(self, device_request: str) -> torch.device:
        device = super().setup(device_request)
        shard = self.config.hsdp.group(self.world_size)
        # FSDP2 reads a 2-D mesh as (replicate, shard): rows of consecutive ranks share the shards.
        self.mesh = init_device_mesh(device.type, (self.world_size // shard, shard),
                                     mesh_dim_names=("replicate", "shard"))
        return device

    def describe(self) -> str:
        shard = self.mesh.size(1)
        return (f"{self.world_size // shard} group(s) of {shard}: parameters sharded within a group, replicated "
                "across groups")
