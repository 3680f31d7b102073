from scaletrain.distributed.strategies.base import Strategy, register_strategy
from scaletrain.distributed.strategies.registry import STRATEGIES, build_strategy, plannable_strategies
from scaletrain.distributed.strategies.single import resolve_device

__all__ = ["STRATEGIES", "Strategy", "build_strategy", "register_strategy", "plannable_strategies", "resolve_device"]
