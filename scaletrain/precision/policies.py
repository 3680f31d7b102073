"""Precision policies: one small class per `--precision` name, picked from a registry.

A policy decides three things and nothing else: the dtype the parameters are stored in, the
autocast region around the forward pass, and whether the loss is scaled. The loss itself is
always computed in float32 by the training step (softmax in fp16 saturates; seed 000's advice).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from scaletrain.config import PRECISIONS as PRECISION_CHOICES
from scaletrain.precision.float32_modules import keep_in_float32
from scaletrain.registry import Registry

# `--precision auto`: settled for the device before anything builds a policy (hardware.py).
AUTO = "auto"

# --grad-compression: the dtype gradients are reduced in.
REDUCE_DTYPES = {"none": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, slots=True)
class PrecisionPolicy:
    name: str
    # dtype the forward's matmuls/convs run in under autocast; None means no autocast.
    autocast_dtype: torch.dtype | None = None
    # dtype the parameters (and so the optimizer state) are stored in.
    param_dtype: torch.dtype = torch.float32
    loss_scaling: bool = False
    # TF32 lets float32 convolutions and matrix products use tensor cores with a 10-bit mantissa
    # (Ampere and newer). PyTorch's own defaults, which `fp32` keeps: cuDNN convolutions in TF32
    # (torch.backends.cudnn.allow_tf32 = True), matrix products in IEEE float32. On WRN-16-10 on an
    # H200 the convolutions' TF32 is 3.35x (BENCHMARKS.md, "The first GPU run").
    tf32_convolutions: bool = True
    tf32_matmul: bool = False

    @property
    def computes_in_16_bit(self) -> bool:
        """Whether matmuls run in fp16/bf16, where tensor cores want sizes in multiples of 8."""
        return self.autocast_dtype is not None or self.param_dtype != torch.float32

    @property
    def input_dtype(self) -> torch.dtype:
        """Floating inputs are cast to this explicitly (never silently run in float64)."""
        return self.param_dtype

    @property
    def uses_tf32(self) -> bool:
        """Whether float32 computations may round to TF32 somewhere (convolutions or matmuls)."""
        return self.tf32_convolutions or self.tf32_matmul

    def backend_flags(self) -> dict[str, object]:
        """The process-wide settings this policy implies (torch.backends' own names)."""
        return {"cudnn.allow_tf32": self.tf32_convolutions, "cuda.matmul.allow_tf32": self.tf32_matmul,
                "float32_matmul_precision": "high" if self.tf32_matmul else "highest"}

    def configure_backend(self) -> None:
        """Sets the process-wide float32 convolution and matmul precision that this policy implies."""
        torch.backends.cudnn.allow_tf32 = self.tf32_convolutions
        torch.backends.cuda.matmul.allow_tf32 = self.tf32_matmul
        torch.set_float32_matmul_precision("high" if self.tf32_matmul else "highest")

    def problem(self, options, kind: str, capability: tuple[int, int] | None) -> str | None:
        """Why this policy cannot train here (one line, with the fix), or None. `options`: the
        PrecisionConfig; `kind`: the device's type; `capability`: a CUDA device's compute
        capability (None before the device is opened: the launch asks first, the Trainer again)."""
        return None

    def notes(self, model: nn.Module, options=None) -> list[str]:
        """What the run's start says about this policy on this model (after convert_module)."""
        return []

    def planned_activation_bytes(self, traced: int, model: nn.Module, options=None) -> int:
        """The activation bytes one step holds under this policy, from `traced`: what the memory
        planner traced on `model` (a fake, unconverted build) under this policy's autocast. The
        trace is the step; a policy that changes what a layer keeps for its backward says how."""
        return traced

    def convert_module(self, model: nn.Module, fp32_modules: list[str] | tuple[str, ...] = (),
                       options=None, gathered: bool = False) -> nn.Module:
        """Casts parameters to the storage dtype and pins the opted-out modules to float32.
        `options`: the PrecisionConfig, for a policy with its own (fp8's recipe); `gathered`: the
        strategy shards the parameters and gathers them for each forward (ZeRO-2/3, FSDP), which
        a policy may gather in its own format (fp8's float8 all-gather)."""
        if self.param_dtype != torch.float32:
            model.to(self.param_dtype)
        if fp32_modules:
            # Under bf16-true the island's output goes back to bf16 so the next layer's
            # bf16 weights see a matching input; under autocast, autocast handles the cast.
            cast_back = self.param_dtype if self.param_dtype != torch.float32 else None
            keep_in_float32(model, fp32_modules, cast_outputs_to=cast_back)
        return model

    def sharded(self, grad_compression: str = "none"):
        """FSDP2's mixed-precision settings under this policy: parameters gathered in the autocast
        dtype (None: as stored), gradients reduced in float32 unless compressed to 16 bits."""
        from torch.distributed.fsdp import MixedPrecisionPolicy
        return MixedPrecisionPolicy(param_dtype=self.autocast_dtype, reduce_dtype=REDUCE_DTYPES[grad_compression])

    @staticmethod
    def sharded_float32(cast_inputs: bool = True):
        """FSDP2's settings for modules kept in float32: those pinned (--fp32-modules), whose inputs
        are cast to float32 too, and batch norm (cast_inputs=False), which takes the 16-bit
        activations with float32 weights as it does under plain autocast (casting them would keep a
        float32 copy of every normalised activation for the backward)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy
        return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                    cast_forward_inputs=cast_inputs)

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)


# The policies by `--precision` name; one more is one more `register_policy` line here.
POLICIES = Registry("precision", "--precision", choices=PRECISION_CHOICES)


def register_policy(name: str, cls: type[PrecisionPolicy] = PrecisionPolicy, **settings) -> PrecisionPolicy:
    """Makes `--precision NAME` the policy with these settings (PrecisionPolicy's fields); `cls`: a
    policy that does more than set dtypes (precision/float8.py)."""
    return POLICIES.add(name, cls(name=name, **settings))


# `fp32` is what PyTorch and Lightning's "32-true" do with no flags; `fp32-strict` is IEEE float32
# everywhere, for bit-for-bit comparisons across GPU generations (3.35x slower on WRN-16-10).
# The 16-bit policies let their float32 islands (--fp32-modules, the loss) use TF32 as well.
register_policy("fp32")
register_policy("fp32-strict", tf32_convolutions=False)
register_policy("tf32", tf32_matmul=True)
register_policy("bf16-mixed", autocast_dtype=torch.bfloat16, tf32_matmul=True)
register_policy("fp16-mixed", autocast_dtype=torch.float16, loss_scaling=True, tf32_matmul=True)
register_policy("bf16-true", param_dtype=torch.bfloat16, tf32_matmul=True)


def get_policy(name: str) -> PrecisionPolicy:
    """The policy `name` names; `auto` must have been settled first (hardware.settle_precision)."""
    if name == AUTO:
        raise ValueError("precision 'auto' reached a policy lookup unsettled: settle it for the device first "
                         "(scaletrain.precision.hardware.settle_precision)")
    return POLICIES.get(name)

