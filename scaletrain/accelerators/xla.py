"""XLA devices through torch_xla: a TPU, or XLA on a CPU (`PJRT_DEVICE=CPU`, `CPU_NUM_DEVICES=N`
for N devices in one process), which is how this project runs the path a TPU user takes.

torch_xla traces tensor operations lazily and runs them as one compiled graph when asked
(`torch_xla.sync()`): the trainer asks once per host round-trip, so `--steps-per-execution N` is
one graph of N training steps (seed 000's `steps_per_execution` on a TPU). Reading a value back
(a log step's losses) waits for the graph; nothing else in the step does.

torch_xla pins its torch (2.9.0 for torch_xla 2.9.0), so it lives in an environment of its own:
`bash scripts/setup.sh xla` makes `.venv-xla`. The main environment never installs it, and
nothing here imports it until a run asks for an XLA device.
"""

from __future__ import annotations

import glob
import importlib.util
import os

import torch

SETUP = "bash scripts/setup.sh xla (makes .venv-xla: torch 2.9.0 with torch_xla 2.9.0)"
MISSING = f"--device xla needs torch_xla, which this environment does not have; {SETUP}"


def installed() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def tpu_present() -> bool:
    """A TPU on this host, as torch_xla finds one: named by PJRT_DEVICE, or its device files."""
    named = os.environ.get("PJRT_DEVICE", "").upper()
    if named:
        return named == "TPU"
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def device() -> torch.device:
    import torch_xla
    return torch_xla.device()


def is_xla(device: torch.device) -> bool:
    return device.type == "xla"


def sync() -> None:
    """Ends the traced graph here and starts running it (asynchronously)."""
    import torch_xla
    torch_xla.sync()


def wait() -> None:
    """Waits until every graph started so far has run (a clock reading's synchronisation)."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    torch_xla.sync()
    xm.wait_device_ops()


def kind() -> str:
    """What the devices are: 'TPU', 'CPU' (XLA on a CPU), 'CUDA'."""
    import torch_xla.runtime as xr
    return xr.device_type()


def device_count() -> int:
    import torch_xla.runtime as xr
    return xr.global_runtime_device_count()


def describe() -> str:
    """For the start line: what ran, honestly named."""
    what = kind()
    count = device_count()
    if what == "CPU":
        return f"xla (XLA on a CPU, {count} device(s); not a TPU)"
    return f"xla ({what}, {count} device(s))"


def rng_state() -> int:
    import torch_xla.core.xla_model as xm
    return int(xm.get_rng_state())


def set_rng_state(seed: int) -> None:
    import torch_xla.core.xla_model as xm
    xm.set_rng_state(int(seed))


def use_spmd() -> None:
    import torch_xla.runtime as xr
    xr.use_spmd()


def batch_mesh(devices: int):
    """A 1-D mesh named ('data',) over `devices` XLA devices."""
    import numpy as np
    from torch_xla.distributed.spmd import Mesh
    return Mesh(np.arange(devices), (devices,), ("data",))


def shard_along_batch(t: torch.Tensor, mesh) -> torch.Tensor:
    import torch_xla.distributed.spmd as xs
    xs.mark_sharding(t, mesh, ("data",) + (None,) * (t.dim() - 1))
    return t


def device_type(name: str) -> str:
    """The kind of device `--device name` trains on ("cpu", "cuda", "xla"), without opening it:
    `auto` is CUDA where there is one, else a TPU through torch_xla where both are here, else the CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "xla" if tpu_present() and installed() else "cpu"
    return name.split(":")[0]


def refuse_unmodelled(command: str, device_name: str | None, what: str) -> None:
    """One line instead of a wrong figure: `command`'s model (`what`) knows CUDA and CPU memory
    and links, not an XLA device's."""
    if device_name and device_type(device_name) == "xla":
        from scaletrain.errors import ConfigError
        raise ConfigError(f"{command}: not modelled for XLA devices ({what}); train on the XLA device and read "
                          "the run's measured figures instead")
