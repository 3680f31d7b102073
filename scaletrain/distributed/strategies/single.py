"""One process, one device: the strategy every other one reduces to when the world has one rank."""

from __future__ import annotations

import torch

from scaletrain.accelerators import xla
from scaletrain.distributed.strategies.base import Strategy, register_strategy
from scaletrain.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        kind = xla.device_type(name)
        return xla.device() if kind == "xla" else torch.device(kind)
    if name == "xla":
        if not xla.installed():
            raise ConfigError(xla.MISSING)
        return xla.device()
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device '{name}'; use auto, cpu, cuda, cuda:N or xla") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device '{name}' was asked for but CUDA is not available; use --device cpu")
    return device


@register_strategy("single")
class SingleDevice(Strategy):
    traffic = "none"
    memory_plan = None   # plan one device as ddp with --devices 1
    # Nothing crosses a link: a configuration made for several processes runs here unchanged.
    grad_compressions = ("none", "bf16", "fp16", "powersgd")
    device_types = ("cpu", "cuda", "xla")

    @classmethod
    def layout_problem(cls, layout, config) -> str | None:
        if layout.world > 1:
            return f"--strategy single cannot run on {layout.world} processes; use --strategy ddp (or auto)"
        return None

    def setup(self, device_request: str) -> torch.device:
        from scaletrain.distributed.devices import bind
        base = resolve_device(device_request)
        self.device = bind(base, self.config.devices, 0, 1) if self.config.devices else base
        return self.device

    def wrap(self, model, compile_fn, block_classes=(), policy=None):
        forward = compile_fn(model)
        return forward, forward
