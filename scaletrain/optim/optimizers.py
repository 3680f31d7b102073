"""Optimizer construction: fused kernels with a device-tensor LR.

Fused SGD/AdamW read `found_inf` on the device and leave weights and state untouched on an
overflowing fp16 step, which is what lets the training step skip without a host sync.
"""

from __future__ import annotations

import torch
from torch import nn

from scaletrain.errors import ConfigError

OPTIMIZERS = ("sgd", "adamw")


def _param_groups(params: list[nn.Parameter], weight_decay: float, decay_all: bool = False) -> list[dict]:
    # Biases and norm scales (1-D tensors) are not decayed unless asked (`decay_all`, torch's own
    # default, which a LightningModule's optimizer brings): decaying them only hurts accuracy.
    # Tensor-parallel (DTensor) parameters get groups of their own: a fused kernel takes one kind.
    # Without weight decay the split means nothing, and each group is one more fused kernel call
    # a step (about 25 us on the 2-core CPU: BENCHMARKS.md, "The step's operations").
    groups: dict[tuple[bool, str], list[nn.Parameter]] = {}
    for p in params:
        if p.requires_grad:
            decayed = decay_all or p.ndim > 1 or weight_decay == 0
            groups.setdefault((decayed, type(p.data).__name__), []).append(p)
    return [{"params": ps, "weight_decay": weight_decay if decay else 0.0}
            for (decay, _), ps in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1]))]


def fused_kernels(device_type: str) -> bool:
    """Whether torch has fused SGD/AdamW kernels for this kind of device: not on an XLA device
    (CPU and CUDA have them; the meta and fake devices the planners count on take them too)."""
    return device_type != "xla"


def device_problem(optimizer: str, device_type: str) -> str | None:
    """Why `optimizer` cannot update parameters on this kind of device without host syncs, or None."""
    if optimizer == "sgd" and not fused_kernels(device_type):
        return (f"--optimizer sgd on an {device_type.upper()} device: torch's SGD without its fused kernel reads the "
                "LR back to the host every step; use --optimizer adamw")
    return None


def build_optimizer(cfg, model: nn.Module, device: torch.device, capturable: bool = False,
                    params: list[nn.Parameter] | None = None) -> torch.optim.Optimizer:
    """An optimizer whose every param group holds the same LR tensor on `device`.
    `capturable` makes AdamW safe to record in a CUDA graph; `params` (default: all of the
    model's) is the subset this rank updates under optimizer-state sharding."""
    lr = torch.tensor(cfg.lr, dtype=torch.float32, device=device)
    groups = _param_groups(list(model.parameters()) if params is None else params, cfg.weight_decay,
                           cfg.decay_all)
    for g in groups:
        g["lr"] = lr
    if cfg.optimizer == "sgd":
        if not fused_kernels(device.type):
            raise ConfigError(device_problem("sgd", device.type))
        if any(kind != "Tensor" and kind != "Parameter" for kind in {type(p.data).__name__ for g in groups
                                                                     for p in g["params"]}):
            # Fused SGD has no sharding rule for DTensors (torch registers fused Adam/AdamW only), and
            # the unfused one reads a tensor LR back to the host every step.
            raise ConfigError("SGD cannot update sharded (DTensor) parameters here: torch has no sharded fused SGD; "
                              "use AdamW (--optimizer adamw, or in a LightningModule's configure_optimizers), or a "
                              "strategy that keeps whole parameters (ddp, zero1)")
        opt = torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=cfg.nesterov, fused=True)
        if cfg.momentum > 0:
            # Fused SGD that skips its very first step (found_inf) leaves an uninitialised
            # momentum buffer behind (seen on torch 2.13 CPU). A zero buffer is exactly the
            # first-step semantics (buf = g) when dampening is 0, so create it up front.
            for g in opt.param_groups:
                for p in g["params"]:
                    opt.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return opt
    if cfg.optimizer == "adamw":
        beta1, beta2 = cfg.betas
        if not fused_kernels(device.type):
            # No fused kernel there (an XLA device): torch's per-tensor update, traced into the
            # step's graph, `capturable` so that its step count and LR stay on the device (else it
            # reads them back to the host every step).
            return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), foreach=False, capturable=True)
        return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), fused=True, capturable=capturable)
    raise ConfigError(f"unknown optimizer '{cfg.optimizer}'; choose one of: {', '.join(OPTIMIZERS)}")


def set_lr(optimizer: torch.optim.Optimizer, value: torch.Tensor) -> None:
    """Writes the LR into each group's tensor in place (no host sync, graph-capturable)."""
    seen = set()
    for g in optimizer.param_groups:
        if id(g["lr"]) not in seen:
            seen.add(id(g["lr"]))
            g["lr"].copy_(value)


def set_momentum(optimizer: torch.optim.Optimizer, value: float) -> None:
    """Each group's momentum (Adam's first beta, SGD's momentum) as a host number: the optimizers
    read it on the host at each step (a captured graph would replay the one it saw)."""
    for g in optimizer.param_groups:
        if "betas" in g:
            g["betas"] = (value, g["betas"][1])
        elif "momentum" in g:
            g["momentum"] = value


def fill_lr(optimizer: torch.optim.Optimizer, value: float) -> None:
    """Writes a host-known LR into each group's tensor in place: one kernel with the value as its
    argument (no host sync; not for a captured graph, which would replay the value it saw)."""
    seen = set()
    for g in optimizer.param_groups:
        if id(g["lr"]) not in seen:
            seen.add(id(g["lr"]))
            g["lr"].fill_(value)


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    lr = optimizer.param_groups[0]["lr"]
    return float(lr) if isinstance(lr, torch.Tensor) else lr
