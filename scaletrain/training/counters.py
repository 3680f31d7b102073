"""Device-resident training counters. The training step only writes into these tensors (a few
tiny kernels per step); the host reads them back in one transfer on log steps and at epoch end.

Each step's loss goes into its own slot of `step_losses` rather than into a running sum: one
kernel instead of the half-dozen a finiteness flag would take, and the host can then name the
exact step at which the loss stopped being finite, and keep the per-step loss curve.
"""

from __future__ import annotations

import torch


class DeviceCounters:
    def __init__(self, device: torch.device, steps_per_epoch: int = 1):
        i64 = dict(dtype=torch.int64, device=device)
        self.step_losses = torch.zeros(max(steps_per_epoch, 1), dtype=torch.float32, device=device)
        self.slot = torch.zeros(1, **i64)       # this epoch's next slot in step_losses
        self.correct = torch.zeros((), **i64)   # this epoch's correct predictions
        # Run totals. `applied_steps` drives the LR schedule and skips fp16 overflow steps.
        self.skipped = torch.zeros((), **i64)
        self.applied_steps = torch.zeros((), **i64)

    def resize(self, steps_per_epoch: int) -> None:
        self.step_losses = torch.zeros(max(steps_per_epoch, 1), dtype=torch.float32, device=self.slot.device)
        self.reset_epoch()

    def reset_epoch(self) -> None:
        self.step_losses.zero_()
        self.slot.zero_()
        self.correct.zero_()

    def read(self, steps_done: int, strategy=None) -> dict:
        """One device-to-host transfer: the losses of the first `steps_done` steps and the totals.
        With a data-parallel strategy the values are first reduced over ranks (one all-reduce):
        losses averaged, correct counts summed; skipped/applied steps are the same on every rank
        (gradients, hence overflow flags, are all-reduced) and are averaged back to themselves."""
        totals = torch.stack([self.correct, self.skipped, self.applied_steps]).to(torch.float64)
        values = torch.cat([self.step_losses[:steps_done].to(torch.float64), totals])
        if strategy is not None and strategy.world_size > 1:
            strategy.all_reduce_sum_(values)
            values /= strategy.world_size
            values[steps_done] *= strategy.world_size  # correct: a sum, not a mean
        values = values.tolist()
        losses, (correct, skipped, applied) = values[:steps_done], values[steps_done:]
        return {"losses": losses, "correct": int(correct), "skipped": int(skipped), "applied_steps": int(applied)}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"step_losses": self.step_losses, "slot": self.slot, "correct": self.correct,
                "skipped": self.skipped, "applied_steps": self.applied_steps}
