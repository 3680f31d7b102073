"""Callbacks: measurement (throughput, time to accuracy, total time), stopping, reporting."""

from scaletrain.callbacks.base import HOOKS, CallbackList
from scaletrain.callbacks.measure import EarlyStopping, StopAtTarget, Throughput, TotalTime
from scaletrain.callbacks.reporting import MetricsLog, ProgressBar

__all__ = ["HOOKS", "CallbackList", "EarlyStopping", "MetricsLog", "ProgressBar", "StopAtTarget",
           "Throughput", "TotalTime"]
