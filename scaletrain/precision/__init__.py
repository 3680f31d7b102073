"""Numeric precision: policies by name, the fp16 loss scaler and the per-module float32 opt-out."""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "POLICIES": "scaletrain.precision.policies",
    "DynamicLossScaler": "scaletrain.precision.loss_scaler",
    "PrecisionPolicy": "scaletrain.precision.policies",
    "get_policy": "scaletrain.precision.policies",
    "keep_in_float32": "scaletrain.precision.float32_modules",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.precision.float32_modules import keep_in_float32
    from scaletrain.precision.loss_scaler import DynamicLossScaler
    from scaletrain.precision.policies import POLICIES, PrecisionPolicy, get_policy
