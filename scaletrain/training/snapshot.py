"""Take and restore the complete training state *in place*.

The untimed warm-up (compilation, CUDA-graph capture) runs real steps; afterwards every tensor is
copied back into the same storage, so the run continues exactly as if the warm-up had not happened
and a captured graph's addresses stay valid. Copies are kept on the host so that a large model
does not need twice its memory on the device.
"""

from __future__ import annotations

import torch
from torch import nn


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Creates the state a first step would create lazily, so it exists before any snapshot or
    graph capture (AdamW: step/exp_avg/exp_avg_sq zeros, exactly what its lazy init makes)."""
    if isinstance(optimizer, torch.optim.AdamW):
        for group in optimizer.param_groups:
            for p in group["params"]:
                state = optimizer.state[p]
                if not state:
                    on_device = group.get("fused") or group.get("capturable")
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu")
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _state_tensors(model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict) -> list[torch.Tensor]:
    tensors = [p.data for p in model.parameters()] + list(model.buffers())
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    for group in optimizer.param_groups:
        if isinstance(group.get("lr"), torch.Tensor):
            tensors.append(group["lr"])
    tensors += list(extra.values())
    unique, seen = [], set()
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            unique.append(t)
    return unique


class TrainingSnapshot:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict[str, torch.Tensor]):
        self.tensors = _state_tensors(model, optimizer, extra)
        self.copies = [t.detach().to("cpu", copy=True) for t in self.tensors]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    @torch.no_grad()
    def restore(self) -> None:
        for tensor, copy in zip(self.tensors, self.copies, strict=True):
            tensor.copy_(copy)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
