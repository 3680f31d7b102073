"""None"""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "STRATEGIES": "scaletrain.distributed.strategies.registry",
    "Strategy": "scaletrain.distributed.strategies.base",
    "build_strategy": "scaletrain.distributed.strategies.registry",
    "register_strategy": "scaletrain.distributed.strategies.base",
    "plannable_strategies": "scaletrain.distributed.strategies.registry",
    "resolve_device": "scaletrain.distributed.strategies.single",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.distributed.strategies.base import Strategy, register_strategy
    from scaletrain.distributed.strategies.registry import STRATEGIES, build_strategy, plannable_strategies
    from scaletrain.distributed.strategies.single import resolve_device
