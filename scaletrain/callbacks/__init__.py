"""Callbacks: measurement (throughput, time to accuracy, total time), stopping, reporting."""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "AllocatorRetries": "scaletrain.callbacks.reporting",
    "CallbackList": "scaletrain.callbacks.base",
    "EarlyStopping": "scaletrain.callbacks.measure",
    "MetricsLog": "scaletrain.callbacks.reporting",
    "ProgressBar": "scaletrain.callbacks.reporting",
    "StopAtTarget": "scaletrain.callbacks.measure",
    "Throughput": "scaletrain.callbacks.measure",
    "TotalTime": "scaletrain.callbacks.measure",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.callbacks.base import CallbackList
    from scaletrain.callbacks.measure import EarlyStopping, StopAtTarget, Throughput, TotalTime
    from scaletrain.callbacks.reporting import AllocatorRetries, MetricsLog, ProgressBar
