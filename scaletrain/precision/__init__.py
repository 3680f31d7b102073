"""Numeric precision: policies by name, the fp16 loss scaler and the per-module float32 opt-out."""

from scaletrain.precision.float32_modules import keep_in_float32
from scaletrain.precision.loss_scaler import DynamicLossScaler
from scaletrain.precision.policies import POLICIES, PrecisionPolicy, get_policy

__all__ = ["POLICIES", "DynamicLossScaler", "PrecisionPolicy", "get_policy", "keep_in_float32"]
