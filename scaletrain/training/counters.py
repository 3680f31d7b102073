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
        # This epoch's training-metric sum (the task's: correct predictions, absolute error), float64
        # so a regression's sum of absolute errors accumulates exactly enough.
        self.metric_sum = torch.zeros((), dtype=torch.float64, device=device)
        # Run totals. `applied_steps` drives the LR schedule and skips fp16 overflow steps.
        self.skipped = torch.zeros((), **i64)
        self.applied_steps = torch.zeros((), **i64)

    def resize(self, steps_per_epoch: int) -> None:
        self.step_losses = torch.zeros(max(steps_per_epoch, 1), dtype=torch.float32, device=self.slot.device)
        self.reset_epoch()

    def reset_epoch(self) -> None:
        self.step_losses.zero_()
        self.slot.zero_()
        self.metric_sum.zero_()

    def read(self, steps_done: int, strategy=None, ran: int | None = None) -> dict:
        """One device-to-host transfer: the losses of the first `steps_done` steps and the totals.
        With several processes the values are first summed over them (one all-reduce) and divided by
        the replicas: losses averaged over replicas, training-metric sums kept as sums. Processes
        that do not record (a pipeline's earlier stages) hold zeros there. Skipped/applied steps are
        the same on every process, so they are divided back by the count of processes summed over.

        `ran`: the steps this process ran, when an epoch may end before every replica has run them
        all (`EpochControl.cuts_epochs`): each step's loss is then averaged over the replicas that ran
        it, and `replica_steps` counts them. The processes summed over count themselves (a one each),
        so a job that lost a worker divides by the processes still there."""
        one = torch.ones((), dtype=torch.float64, device=self.metric_sum.device)
        totals = torch.stack([self.metric_sum, self.skipped.double(), self.applied_steps.double(), one])
        values = torch.cat([self.step_losses[:steps_done].to(torch.float64), totals])
        replica_steps = float(steps_done)
        if ran is not None:
            recorded = float(strategy.layout.records if strategy is not None else True)
            ran_mask = (torch.arange(steps_done, device=values.device) < ran).to(torch.float64) * recorded
            values = torch.cat([values, ran_mask])
        if strategy is not None and strategy.world_size > 1:
            strategy.all_reduce_sum_(values)
            if ran is None:
                values[:steps_done] /= strategy.layout.replicas
                replica_steps *= strategy.layout.replicas
            else:
                runners = values[steps_done + 4:]
                values[:steps_done] /= runners.clamp(min=1)
                replica_steps = float(runners.sum())
            values[steps_done + 1:steps_done + 3] /= values[steps_done + 3]
        values = values[:steps_done + 3].tolist()
        losses, (metric_sum, skipped, applied) = values[:steps_done], values[steps_done:]
        return {"losses": losses, "metric_sum": metric_sum, "skipped": int(skipped), "applied_steps": int(applied),
                "replica_steps": replica_steps}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"step_losses": self.step_losses, "slot": self.slot, "metric_sum": self.metric_sum,
                "skipped": self.skipped, "applied_steps": self.applied_steps}
