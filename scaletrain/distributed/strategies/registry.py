"""Strategies by name. `auto` is ddp when the job has several processes, single otherwise.

Each strategy registers itself with `@register_strategy` (base.py), and its module (in this
package or a sub-package) is imported when its name is asked for (registry.py), so a new
strategy is one new file: nothing else lists it.
"""

from __future__ import annotations

from scaletrain.distributed.env import DistEnv, dist_env
from scaletrain.distributed.layout import Layout
from scaletrain.distributed.strategies.base import STRATEGIES, Strategy


def plannable_strategies() -> tuple[str, ...]:
    """The strategies `plan-memory` lays out device by device (and compares side by side)."""
    return tuple(sorted((name for name, cls in STRATEGIES.items() if cls.memory_plan == "device"),
                        key=lambda name: STRATEGIES[name].zero_stage))


def strategy_class(config, world: int) -> type[Strategy]:
    """The class the DistributedConfig `config` names for a job of `world` processes."""
    name = config.strategy
    if name == "auto":
        name = "ddp" if world > 1 else "single"
    return STRATEGIES.get(name)


def build_layout(config, world: int, rank: int = 0) -> Layout:
    """The layout of `world` processes under `config` (checked: raises ConfigError)."""
    return Layout.build(strategy_class(config, world), config, world, rank)


def build_strategy(config, env: DistEnv | None = None) -> Strategy:
    """An un-set-up strategy for the DistributedConfig `config`; call `.setup(device)` next."""
    env = env or dist_env()
    cls = strategy_class(config, env.world_size)
    return cls(config, env, Layout.build(cls, config, env.world_size, env.rank))
