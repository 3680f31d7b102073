"""Strategies by name. `auto` is ddp when the job has several processes, single otherwise.

Each strategy registers itself with `@register_strategy` (base.py); importing the modules here is
what fills STRATEGIES, so a new strategy file is added to the import list below.
"""

from __future__ import annotations

from scaletrain.distributed.env import DistEnv, dist_env
from scaletrain.distributed.strategies import (ddp, fsdp, model_parallel, parameter_server, single,  # noqa: F401
                                                zero1)  # (they register)
from scaletrain.distributed.strategies.base import STRATEGIES, Strategy
from scaletrain.errors import ConfigError


def plannable_strategies() -> tuple[str, ...]:
    """The strategies `plan-memory` can lay out."""
    return tuple(sorted((name for name, cls in STRATEGIES.items() if cls.plannable),
                        key=lambda name: STRATEGIES[name].zero_stage))


def build_strategy(config, env: DistEnv | None = None) -> Strategy:
    """An un-set-up strategy for the DistributedConfig `config`; call `.setup(device)` next."""
    env = env or dist_env()
    name = config.strategy
    if name == "auto":
        name = "ddp" if env.world_size > 1 else "single"
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy '{name}'; choose one of: auto, {', '.join(STRATEGIES)}")
    return STRATEGIES[name](config, env)
