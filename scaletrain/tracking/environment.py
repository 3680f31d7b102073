"""What a result was measured on: device, driver and library versions, host, code version."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from pathlib import Path

import torch


def git_state(folder: str | Path = ".") -> dict | None:
    """The commit of the working directory's repository and whether it has uncommitted changes;
    None outside a repository (or without git)."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status), "branch": git("rev-parse", "--abbrev-ref", "HEAD")}


def nvidia_driver_version() -> str | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # no NVML library, no driver, no GPU: the field stays empty
        return None


def capture_environment(device: torch.device, device_name: str, world_size: int = 1) -> dict:
    from scaletrain.version import __version__
    env = {
        "device": device_name,
        "device_type": device.type,
        "world_size": world_size,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "driver": nvidia_driver_version() if device.type == "cuda" else None,
        "scaletrain": __version__,
        "git": git_state(),
        "argv": sys.argv,
        # The CPU thread pools the run computed with (--intra-op-threads / --inter-op-threads, or
        # a multi/tune slot's share of the cores, or torch's default).
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
    }
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        env["compute_capability"] = f"{major}.{minor}"
        env["device_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
    return env
