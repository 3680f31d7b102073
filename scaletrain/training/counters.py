"""Device-resident training counters: the training step only ever adds to these tensors; the host
reads them back in one transfer on log steps and at epoch end."""

from __future__ import annotations

import torch


class DeviceCounters:
    FIELDS = ("loss_sum", "correct", "samples", "skipped", "applied_steps", "step", "first_nonfinite_step")

    def __init__(self, device: torch.device):
        f32 = dict(dtype=torch.float32, device=device)
        i64 = dict(dtype=torch.int64, device=device)
        # Per-epoch sums (reset every epoch).
        self.loss_sum = torch.zeros((), **f32)
        self.correct = torch.zeros((), **i64)
        self.samples = torch.zeros((), **i64)
        # Run totals. `applied_steps` drives the LR schedule and skips fp16 overflow steps.
        self.skipped = torch.zeros((), **i64)
        self.applied_steps = torch.zeros((), **i64)
        self.step = torch.zeros((), **i64)
        self.first_nonfinite_step = torch.full((), -1, **i64)

    def reset_epoch(self) -> None:
        self.loss_sum.zero_()
        self.correct.zero_()
        self.samples.zero_()

    def read(self) -> dict[str, float]:
        """One device-to-host transfer for every counter."""
        values = torch.stack([getattr(self, f).to(torch.float64) for f in self.FIELDS]).tolist()
        return dict(zip(self.FIELDS, values))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f: getattr(self, f) for f in self.FIELDS}
