from scaletrain.distributed.strategies.base import Strategy
from scaletrain.distributed.strategies.registry import STRATEGIES, build_strategy
from scaletrain.distributed.strategies.single import resolve_device

__all__ = ["STRATEGIES", "Strategy", "build_strategy", "resolve_device"]
