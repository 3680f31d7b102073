"""The settings a run takes from the hardware when it is not told: precision, memory format,
cuDNN's algorithm search and CPU threads (threads.py). Each choice is a `Setting`: its value and,
when scaletrain chose it, why, so the start line says it and the run record keeps it.

What each default gains is measured, not assumed (BENCHMARKS.md, "Fast by default"):
- `--precision auto`: bf16-mixed where the device computes bfloat16 natively, fp32 elsewhere
  (precision/hardware.py's `auto_precision`).
- channels_last on a GPU for a model with 2-D convolutions: cuDNN's tensor-core convolutions work
  in NHWC; in NCHW each one is bracketed by two transposes (WRN-16-10 bf16-mixed eager on an H200:
  22,098 img/s with channels_last and fusing against 14,427 without either, fusing alone worth
  under 2 %). On a CPU oneDNN gains nothing measurable here and
  the model stays as the user wrote it.
- cudnn.benchmark on a GPU when every batch has the same shape: cuDNN times its algorithms once per
  shape and keeps the fastest. A shape that changes every batch (a padding collate function) would
  pay that search again and again, so it stays off there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # torch is imported where a choice is made: the CLI reads Setting before torch loads
    import torch
    from torch import nn


@dataclass(frozen=True, slots=True)
class Setting:
    name: str            # "precision", "channels_last", "cudnn.benchmark", "threads"
    value: object
    why: str | None      # None: the configuration named it; else how scaletrain chose it
    figures: dict | None = None   # what was measured to choose it (the probe's candidates and times)

    def describe(self) -> str:
        value = {True: "on", False: "off"}.get(self.value, self.value) if isinstance(self.value, bool) else self.value
        return f"{self.name} {value}" + (f" ({self.why})" if self.why else "")

    def record(self) -> dict:
        return {"value": self.value, "chosen": self.why, **({"measured": self.figures} if self.figures else {})}


def device_kind_here(cfg) -> str:
    """The kind of device this process trains on (cfg.device): cuda, cpu or xla, without opening
    an XLA device (SPMD must be switched on before its runtime starts)."""
    from scaletrain.accelerators.xla import device_type
    from scaletrain.distributed import resolve_device
    return "xla" if device_type(cfg.device) == "xla" else resolve_device(cfg.device).type


def settle_precision_here(cfg) -> Setting:
    """Writes the policy `--precision auto` means on the device this process trains on (cfg.device)
    into the configuration; returns it as a Setting (why: None where the configuration named it).
    Every command that plans, measures or starts a run from a configuration settles it first."""
    from scaletrain.accelerators.xla import device_type
    from scaletrain.distributed import resolve_device
    from scaletrain.precision.hardware import device_facts, settle_precision, xla_facts
    requested = cfg.precision.policy
    if requested != "auto":
        return Setting("precision", requested, None)
    # An XLA device is not opened here: SPMD must be switched on before its runtime starts.
    facts = xla_facts() if device_type(cfg.device) == "xla" else device_facts(resolve_device(cfg.device))
    cfg.precision.policy, why = settle_precision(requested, facts)
    return Setting("precision", cfg.precision.policy, why)


def choose_compile(given: bool | None) -> Setting:
    """`--compile` as given, or (None) off: compiling pays only where a run's steps repay its
    compile time, which the probe (probe.py) measures on the run's own step where the run is long
    enough (the default recipe's 1-D CNN compiled in 19 s cold for a 1.04-1.20x step on a 2-core CPU)."""
    if given is not None:
        return Setting("compile", given, None)
    return Setting("compile", False, "auto: eager unless measured to repay its compile")


def choose_cuda_graphs(given: bool | None, steps_per_execution: int, device_kind: str,
                       supported: bool) -> Setting | None:
    """A question for the probe, or None where there is none: on a GPU, with `--cuda-graphs` not
    named and one step per execution (several are captured by their own rule), under a strategy
    that can capture its step. Until measured, off: a graph repays only a launch-bound step."""
    if given is not None or steps_per_execution > 1 or device_kind != "cuda" or not supported:
        return None
    return Setting("cuda_graphs", False, "auto: off unless measured faster")


def describe_settings(settings: list[Setting]) -> str:
    """One line for the run's start: every setting, each with why where scaletrain chose it."""
    return "; ".join(s.describe() for s in settings)


def has_2d_convolutions(model: nn.Module) -> bool:
    from torch import nn
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def _a_device(device: torch.device) -> str:
    return "an XLA device" if device.type == "xla" else "a CPU"


def choose_channels_last(given: bool | None, device: torch.device, convolutions_2d: bool) -> Setting:
    """`--channels-last` as given, or (None) on for a GPU and a model with 2-D convolutions."""
    if given is not None:
        return Setting("channels_last", given, None)
    if device.type != "cuda":   # (XLA chooses its own layouts)
        return Setting("channels_last", False, f"auto: off on {_a_device(device)}")
    if not convolutions_2d:
        return Setting("channels_last", False, "auto: the model has no 2-D convolutions")
    return Setting("channels_last", True, "auto: 2-D convolutions on a GPU; --no-channels-last turns it off")


def choose_cudnn_benchmark(given: bool | None, device: torch.device, fixed_shapes: bool) -> Setting:
    """`--cudnn-benchmark` as given, or (None) on for a GPU whose batches all have one shape."""
    if given is not None:
        return Setting("cudnn.benchmark", given, None)
    if device.type != "cuda":
        return Setting("cudnn.benchmark", False, f"auto: no cuDNN on {_a_device(device)}")
    if not fixed_shapes:
        return Setting("cudnn.benchmark", False, "auto: the batches' shapes may vary (your collate function)")
    return Setting("cudnn.benchmark", True, "auto: every batch has one shape; --no-cudnn-benchmark turns it off")


def fixed_batch_shapes(split) -> bool:
    """Whether a training split's batches all have one shape: our arrays and shards do, and so do a
    user's samples collated by torch's default (which stacks them, so they must match); a user's
    own collate function may pad each batch to its longest sample."""
    return getattr(split, "collate_fn", None) is None
