"""Dynamic loss scaling for fp16-mixed, kept entirely on the device.

torch.amp.GradScaler decides whether to skip a step with a host read of `found_inf` unless the
optimizer is fused; we always hand the flag to a fused optimizer and also use it for our own
device-side counters (skipped steps, the LR schedule's step), so no step ever waits on the host.
The kernels are the ones GradScaler itself uses.
"""

from __future__ import annotations

from collections import defaultdict

import torch


class DynamicLossScaler:
    def __init__(self, device: torch.device, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        self.scale = torch.full((), init_scale, dtype=torch.float32, device=device)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self.found_inf = torch.zeros((), dtype=torch.float32, device=device)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    @torch.no_grad()
    def unscale_(self, params) -> torch.Tensor:
        """Divides gradients by the scale in place; returns the (device) inf/NaN flag, 1.0 if any."""
        self.found_inf.zero_()
        inv_scale = self.scale.double().reciprocal().float()
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
        for p in params:
            if p.grad is not None:
                # A sharded (DTensor) gradient is checked shard by shard; the strategy then takes
                # the max of the flags over ranks.
                grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                by_dtype[grad.dtype].append(grad)
        for grads in by_dtype.values():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, inv_scale)
        return self.found_inf

    @torch.no_grad()
    def update(self) -> None:
        """Backs off after an overflow, grows after `growth_interval` clean steps."""
        torch._amp_update_scale_(self.scale, self.growth_tracker, self.found_inf,
                                 self.growth_factor, self.backoff_factor, self.growth_interval)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"loss_scale": self.scale, "loss_scale_growth_tracker": self.growth_tracker}

    def state_dict(self) -> dict:
        return {"scale": self.scale.clone(), "growth_tracker": self.growth_tracker.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.scale.copy_(state["scale"])
        self.growth_tracker.copy_(state["growth_tracker"])
