"""Strategies by name. `auto` is ddp when the job has several processes, single otherwise."""

from __future__ import annotations

from scaletrain.distributed.env import DistEnv, dist_env
from scaletrain.distributed.strategies.base import Strategy
from scaletrain.distributed.strategies.ddp import DDPStrategy
from scaletrain.distributed.strategies.fsdp import FSDPStrategy, Zero2Strategy
from scaletrain.distributed.strategies.single import SingleDevice
from scaletrain.distributed.strategies.zero1 import Zero1Strategy
from scaletrain.errors import ConfigError

STRATEGIES: dict[str, type[Strategy]] = {"single": SingleDevice, "ddp": DDPStrategy, "zero1": Zero1Strategy,
                                         "zero2": Zero2Strategy, "fsdp": FSDPStrategy}


def build_strategy(config, env: DistEnv | None = None) -> Strategy:
    """An un-set-up strategy for the DistributedConfig `config`; call `.setup(device)` next."""
    env = env or dist_env()
    name = config.strategy
    if name == "auto":
        name = "ddp" if env.world_size > 1 else "single"
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy '{name}'; choose one of: auto, {', '.join(STRATEGIES)}")
    return STRATEGIES[name](config, env)
