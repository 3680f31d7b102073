"""[distributed.fsdp]: the options of fsdp and zero2 (fsdp.py), in a module of their own that
imports no torch, so the command line and the config see them without importing the strategy."""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import register_table
from scaletrain.options import option as _f


@dataclass(kw_only=True, slots=True)
class FSDPOptions:
    """[distributed.fsdp]."""
    cpu_offload: bool = _f(False, "--strategy fsdp/zero2: keep each rank's parameter, gradient and optimizer "
                                  "shards in host memory (FSDP2's CPUOffloadPolicy; seed 004's offload): the device "
                                  "holds only the parameters gathered for the step and the activations, and the "
                                  "optimizer steps on the host")


register_table("fsdp", FSDPOptions, owners=("fsdp", "zero2"))
