"""Shared helpers for the benchmarks: environment record, FLOP count, MFU, statistics."""

from __future__ import annotations

import datetime
import platform
import statistics

import torch
from torch.utils.flop_counter import FlopCounterMode

# Dense peaks of an H100 SXM (MEASURE.md), FLOP/s.
H100_PEAK = {"fp32": 67e12, "tf32": 495e12, "bf16-mixed": 989e12, "fp16-mixed": 989e12, "bf16-true": 989e12}


def environment(device: torch.device) -> dict:
    info = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    else:
        info["device"] = f"cpu {platform.machine()} ({torch.get_num_threads()} threads)"
    return info


def train_flops_per_sample(model: torch.nn.Module, sample_shape, device) -> float:
    """Forward + backward FLOPs of one sample, counted by FlopCounterMode on a batch of 2."""
    x = torch.randn(2, *sample_shape, device=device)
    counter = FlopCounterMode(display=False)
    with counter:
        model(x).float().sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 2


def mfu(images_per_sec: float, flops_per_sample: float, precision: str, device: torch.device) -> float | None:
    if device.type != "cuda" or "H100" not in torch.cuda.get_device_name(device):
        return None
    return images_per_sec * flops_per_sample / H100_PEAK[precision]


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
