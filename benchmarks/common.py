"""Shared helpers for the benchmarks: environment record, FLOP count, MFU, statistics."""

from __future__ import annotations

import datetime
import platform
import statistics

import torch

from scaletrain.prediction.hardware import H100_PEAK  # noqa: F401  (re-exported for the benchmarks)
from scaletrain.prediction.measure import train_flops_per_sample  # noqa: F401


def environment(device: torch.device) -> dict:
    info = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    else:
        info["device"] = f"cpu {platform.machine()} ({torch.get_num_threads()} threads)"
    return info


def mfu(images_per_sec: float, flops_per_sample: float, precision: str, device: torch.device) -> float | None:
    if device.type != "cuda" or "H100" not in torch.cuda.get_device_name(device):
        return None
    return images_per_sec * flops_per_sample / H100_PEAK[precision]


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def print_epochs(times: dict[str, list[float]]) -> None:
    """One line per arm: its per-epoch seconds as a median (min, max) in ms."""
    width = max(map(len, times)) + 1
    for name, values in times.items():
        s = spread([v * 1e3 for v in values])
        print(f"{name:{width}s} epoch {s['median']:8.1f} ms (min {s['min']:.1f}, max {s['max']:.1f})")


def slow_worker(delay_s: float, model: str = "mlp") -> list[str]:
    """Flags that make rank 1 a slow worker on purpose: `model` whose training forwards sleep
    `delay_s` there (tests/plugins/faulty_models.py; the command's environment needs
    `with_plugins`)."""
    return ["--model", "faulty_models:slow_worker", "--model-option", f"model={model}",
            "--model-option", f"delay_s={delay_s}"]


def with_plugins(env: dict) -> dict:
    """`env` with the tests' plugins (tests/plugins) on PYTHONPATH."""
    from pathlib import Path
    plugins = str(Path(__file__).resolve().parents[1] / "tests" / "plugins")
    return {**env, "PYTHONPATH": ":".join(filter(None, [plugins, env.get("PYTHONPATH")]))}
