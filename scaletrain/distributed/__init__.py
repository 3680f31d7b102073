"""Running one training over many devices and hosts: where a process sits (env, cluster spec),
how the batch and the data are split (batching, sharding), and the strategies that apply it."""

from scaletrain.distributed.batching import BatchPlan, plan_batch
from scaletrain.distributed.env import DistEnv, dist_env
from scaletrain.distributed.strategies import (STRATEGIES, Strategy, build_strategy, plannable_strategies,
                                                register_strategy, resolve_device)

__all__ = ["STRATEGIES", "BatchPlan", "DistEnv", "Strategy", "build_strategy", "dist_env", "plan_batch",
           "plannable_strategies", "register_strategy", "resolve_device"]
