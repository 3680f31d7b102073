"""[distributed.hsdp]: the hybrid sharded strategy's options (hsdp.py), in a module of their own
that imports no torch, so the command line and the config see them without importing the strategy."""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import register_table
from scaletrain.options import option as _f


@dataclass(kw_only=True, slots=True)
class HSDPOptions:
    """[distributed.hsdp]."""
    shard_size: int = _f(0, "--strategy hsdp: ranks each parameter is sharded over; the job's ranks form groups of "
                            "this many, replicated across groups (0: the processes of one host)", ge=0)

    def group(self, world: int) -> int:
        """The shard group's size in a job of `world` processes."""
        from scaletrain.distributed.env import env_int
        return self.shard_size or env_int("LOCAL_WORLD_SIZE", world, low=1)


register_table("hsdp", HSDPOptions, owners=("hsdp",))
