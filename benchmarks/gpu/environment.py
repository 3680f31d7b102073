"""Part a: the machine. GPU name, memory, driver, CUDA, torch, compute capability, clocks, package
versions, and the two ceilings METHOD.md asks for, measured here: a bf16 matrix product's rate
and a device-to-device copy's bandwidth (the MFU of later parts is against both)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from benchmarks.gpu.kit import Part, case

TITLE = "environment"
LIMIT_S = 12.0


def _smi(fields: str) -> dict:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10, check=True).stdout.strip().splitlines()[0]
    return dict(zip(fields.split(","), (v.strip() for v in out.split(",")), strict=True))


def _commit() -> str:
    # The GPU machine gets the working tree without .git: the command passes the commit along.
    if os.environ.get("SCALETRAIN_COMMIT"):
        return os.environ["SCALETRAIN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _versions() -> dict:
    found = {}
    for name in ("lightning", "pytorch-lightning", "optuna", "numpy", "rich", "triton", "nvidia-ml-py", "mnist1d"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def _timed(fn, device: torch.device, repeats: int) -> list[float]:
    """Seconds of each call, the device synchronised around it, after two untimed calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            import time
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return sorted(times)


def matmul_rate(device: torch.device, n: int) -> dict:
    # Random data (METHOD.md: zeros run faster than real data); median of 10 after 2 warm-ups.
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = _timed(lambda: a @ b, device, 10)
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "tflops_median": 2 * n**3 / times[len(times) // 2] / 1e12,
            "tflops_min": 2 * n**3 / times[-1] / 1e12, "tflops_max": 2 * n**3 / times[0] / 1e12}


def copy_bandwidth(device: torch.device, mib: int) -> dict:
    src = torch.randn(mib * 2**18, device=device)   # float32: mib MiB
    dst = torch.empty_like(src)
    times = _timed(lambda: dst.copy_(src), device, 10)
    moved = 2 * src.numel() * 4   # bytes read plus bytes written
    return {"mib": mib, "tb_per_s_median": moved / times[len(times) // 2] / 1e12, "tb_per_s_max": moved / times[0] / 1e12}


def run(part: Part) -> None:
    device = part.device
    notes = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "python": platform.python_version(),
             "commit": _commit(), "cpu_threads": torch.get_num_threads(), "packages": _versions()}
    if part.cuda:
        props = torch.cuda.get_device_properties(device)
        notes.update(device=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                     capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count,
                     cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
        try:
            smi = _smi("driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu")
            notes.update(driver=smi.pop("driver_version"), **{k.replace(".", "_"): v for k, v in smi.items()})
        except (OSError, subprocess.SubprocessError, IndexError) as exc:
            notes["nvidia_smi"] = f"unavailable: {exc}"
    else:
        notes.update(device=f"cpu {platform.machine()} ({platform.processor() or 'unknown'})", cuda=None)
    part.note(**notes)
    big = part.cuda and not part.rehearse
    case(part, "bf16 matrix product" if part.cuda else "fp32 matrix product",
         lambda: matmul_rate(device, 8192 if big else 512))
    case(part, "device-to-device copy", lambda: copy_bandwidth(device, 2048 if big else 64))
    if part.cuda:
        smi = _smi("clocks.sm,clocks.mem")   # the clocks under load, just after the products
        part.note(clocks_sm_after_load=smi["clocks.sm"], clocks_mem_after_load=smi["clocks.mem"])
