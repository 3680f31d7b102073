"""`--devices 0,2`: the devices a job's processes use, one each (seed 002's
`MirroredStrategy(devices=[...])` on a subset of the machine).

On GPUs a process uses GPU devices[local rank] (and creates no context on the others); on a CPU
host a "device" is a core: process i is pinned to core devices[i] with one thread, so two jobs
on one machine, or a job beside other work, do not fight over cores. Without --devices: GPU
local-rank, and the cores shared among the processes. Checked against the host before any worker
starts (`check_host_devices`) and again in each process (`bind`), which plain torchrun also reaches.
"""

from __future__ import annotations

import os

import torch

from scaletrain.errors import ConfigError


def usable_cores() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def check_host_devices(devices: list[int], device_type: str) -> None:
    """One line when `devices` names a GPU (device_type "cuda") or core ("cpu") this host lacks."""
    if not devices:
        return
    if device_type == "cuda":
        have = torch.cuda.device_count()
        missing = [d for d in devices if d >= have]
        if missing:
            raise ConfigError(f"--devices {','.join(map(str, devices))}: this host has {have} GPU(s) (0-{have - 1}), "
                              f"no GPU {', '.join(map(str, missing))}; name GPUs it has")
        return
    cores = usable_cores()
    missing = [d for d in devices if d not in cores]
    if missing:
        raise ConfigError(f"--devices {','.join(map(str, devices))}: on a CPU host a device is a core, and this "
                          f"process may use cores {_ranges(sorted(cores))}, not {', '.join(map(str, missing))}; "
                          "name cores it may use")


def bind(base: torch.device, devices: list[int], local_rank: int, local_world: int) -> torch.device:
    """The device of the process with `local_rank` of `local_world` on this host, bound to it: a
    GPU made current, or a core this process is pinned to (with one thread)."""
    if not devices:
        return torch.device("cuda", local_rank) if base.type == "cuda" else base
    if len(devices) != local_world:
        raise ConfigError(f"--devices {','.join(map(str, devices))} names {len(devices)} device(s) for {local_world} "
                          f"process(es) on this host; name one device per process (--nproc {len(devices)})")
    check_host_devices(devices, base.type)
    chosen = devices[local_rank]
    if base.type == "cuda":
        return torch.device("cuda", chosen)
    os.sched_setaffinity(0, {chosen})
    torch.set_num_threads(1)
    return base


def _ranges(cores: list[int]) -> str:
    """0-3,6 for [0, 1, 2, 3, 6]."""
    parts, start = [], None
    for i, core in enumerate(cores):
        if start is None:
            start = core
        if i + 1 == len(cores) or cores[i + 1] != core + 1:
            parts.append(f"{start}-{core}" if core != start else str(core))
            start = None
    return ",".join(parts)
