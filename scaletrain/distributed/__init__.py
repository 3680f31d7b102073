"""Running one training over many devices and hosts: where a process sits (env, cluster spec),
how the batch and the data are split (batching, sharding), and the strategies that apply it."""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "STRATEGIES": "scaletrain.distributed.strategies.registry",
    "BatchDivision": "scaletrain.distributed.batching",
    "DistEnv": "scaletrain.distributed.env",
    "Strategy": "scaletrain.distributed.strategies",
    "build_strategy": "scaletrain.distributed.strategies",
    "dist_env": "scaletrain.distributed.env",
    "divide_batch": "scaletrain.distributed.batching",
    "plannable_strategies": "scaletrain.distributed.strategies",
    "register_strategy": "scaletrain.distributed.strategies",
    "resolve_device": "scaletrain.distributed.strategies",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.distributed.batching import BatchDivision, divide_batch
    from scaletrain.distributed.env import DistEnv, dist_env
    from scaletrain.distributed.strategies import (
        Strategy,
        build_strategy,
        plannable_strategies,
        register_strategy,
        resolve_device,
    )
    from scaletrain.distributed.strategies.registry import STRATEGIES
