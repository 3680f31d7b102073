"""Training counters kept on the device: the step writes them without a host synchronisation; the
host reads them back in one transfer on log steps and at epoch end.

Each step's loss goes into its own slot of `step_losses` rather than into a running sum, so the
host can name the exact step at which the loss stopped being finite, and keep the per-step loss
curve.

Two ways of writing them, one state:
- **host-indexed** (the eager step without fp16's device-side overflow flag, the default): the
  host knows which step it is on, so a step's loss is kept as a reference (no kernel), a small
  step's output and targets likewise for the training metric (DEFERRED_METRIC_ELEMENTS), and the
  step counters as host integers; they reach the tensors in a few kernels whenever someone reads
  them (a log step, an epoch's end, a checkpoint, a snapshot). A tiny step then costs what a hand
  loop costs, where writing every counter every step took seventeen small operations
  (BENCHMARKS.md, "The step's operations").
- **device-indexed** (a captured CUDA graph, fp16's loss scaling): a graph replays the same kernels
  every step, and an fp16 step counts as applied only if its gradients were finite, which the
  device alone knows; so the step writes the tensors itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Host-indexed, eager forward: a step's output of at most this many elements (a classifier's
# logits) is kept with its targets until the next read, where the task's training metric runs
# once over all of them: three kernels a read instead of three a step, which in a tiny step cost
# 3 % (BENCHMARKS.md, "The step's operations"). A larger output (a language model's logits) is
# scored at once, so that it is freed before the backward; so are outputs a compiled forward
# returns (CUDA-graph trees reuse their memory at the next call).
DEFERRED_METRIC_ELEMENTS = 1 << 16


class DeviceCounters:
    def __init__(self, device: torch.device, steps_per_epoch: int = 1, host_indexed: bool = False,
                 defer_metrics: bool = False):
        i64 = dict(dtype=torch.int64, device=device)
        self.step_losses = torch.zeros(max(steps_per_epoch, 1), dtype=torch.float32, device=device)
        self.slot = torch.zeros(1, **i64)       # this epoch's next slot in step_losses
        # This epoch's training-metric sum (the task's: correct predictions, absolute error), float64
        # so a regression's sum of absolute errors accumulates exactly enough.
        self.metric_sum = torch.zeros((), dtype=torch.float64, device=device)
        # Run totals. `applied_steps` drives the LR schedule and skips fp16 overflow steps.
        self.skipped = torch.zeros((), **i64)
        self.applied_steps = torch.zeros((), **i64)
        self.host_indexed = host_indexed
        # Host-indexed only: the steps' values not yet written, and the host's copies of the slot
        # and applied-step count (valid unless someone took the tensors to write them).
        self._losses: list[torch.Tensor] = []    # one per slot, from `_first_slot` on
        self._first_slot = 0
        self._metrics: list[torch.Tensor] = []
        self.defer_metrics = host_indexed and defer_metrics
        self._deferred: list[tuple[torch.Tensor, torch.Tensor]] = []     # (output, targets)
        self._metric_of: Callable | None = None
        self._slot = 0
        self._applied = 0
        self._mirrored = True

    # ------------------------------------------------------------------ the step's writes
    def add_loss(self, value: torch.Tensor) -> None:
        """Adds a 0-d loss (one micro-batch's share) to this step's slot."""
        if not self.host_indexed:
            self.step_losses.index_add_(0, self.slot, value.view(1))
            return
        self._mirror()
        if self._losses and self._first_slot + len(self._losses) - 1 == self._slot:
            self._losses[-1] = self._losses[-1] + value       # the step's next micro-batch
        else:
            if not self._losses:
                self._first_slot = self._slot
            self._losses.append(value)

    def add_metric(self, metric_sum: Callable[[Any, torch.Tensor], torch.Tensor], output: Any, y: Any) -> None:
        """Adds a micro-batch's training-metric sum, `metric_sum(output, y)`, to the epoch's: now, or
        at the next read over every deferred batch at once (a sum over the batches' concatenation
        is the sum of their sums)."""
        if (self.defer_metrics and isinstance(output, torch.Tensor) and isinstance(y, torch.Tensor)
                and output.numel() <= DEFERRED_METRIC_ELEMENTS):
            if self._deferred and (self._metric_of != metric_sum or not _stackable(self._deferred[-1], output, y)):
                self._score_deferred()
            self._metric_of = metric_sum
            self._deferred.append((output.detach(), y))
            return
        value = metric_sum(output, y)
        if self.host_indexed:
            self._metrics.append(value)
        else:
            self.metric_sum.add_(value)

    def _score_deferred(self) -> None:
        if self._deferred:
            outputs, ys = zip(*self._deferred, strict=True)
            self._metrics.append(self._metric_of(torch.cat(outputs), torch.cat(ys)))
            self._deferred.clear()

    def end_step(self, found_inf: torch.Tensor | None = None) -> None:
        """Advances to the next step's slot; the step counts as applied unless `found_inf` is 1."""
        if self.host_indexed and found_inf is None:
            self._mirror()
            self._slot += 1
            self._applied += 1
            return
        if found_inf is not None:
            skipped = found_inf.to(torch.int64)
            self.skipped.add_(skipped)
            self.applied_steps.add_(1 - skipped)
        else:
            self.applied_steps.add_(1)
        self.slot.add_(1)

    def applied_index(self) -> int:
        """Host-indexed: the applied-step count (the LR schedule's position), known on the host."""
        self._mirror()
        return self._applied

    # ------------------------------------------------------------------ reading and writing whole
    def applied(self) -> int:
        """The applied-step count (a host read)."""
        self._flush()
        return int(self.applied_steps)

    def set_applied(self, steps: int) -> None:
        self._flush()
        self._mirror()
        self.applied_steps.fill_(steps)
        self._applied = steps

    def resize(self, steps_per_epoch: int) -> None:
        self.step_losses = torch.zeros(max(steps_per_epoch, 1), dtype=torch.float32, device=self.slot.device)
        self.reset_epoch()

    def reset_epoch(self) -> None:
        self._losses.clear()
        self._metrics.clear()
        self._deferred.clear()
        self.step_losses.zero_()
        self.slot.zero_()
        self.metric_sum.zero_()
        self._slot = 0

    def restored(self) -> None:
        """The tensors were written from outside (a snapshot put back, a checkpoint loaded): what
        the host held is dropped, and its copies of the positions are read again at the next step."""
        self._losses.clear()
        self._metrics.clear()
        self._deferred.clear()
        self._mirrored = False

    def _mirror(self) -> None:
        if not self._mirrored:
            self._slot, self._applied = int(self.slot), int(self.applied_steps)
            self._mirrored = True

    @torch.no_grad()
    def _flush(self) -> None:
        """Host-indexed: writes the steps kept on the host into the tensors (a few kernels)."""
        if not self.host_indexed:
            return
        if self._losses:
            first = self._first_slot
            self.step_losses[first:first + len(self._losses)].add_(torch.stack(self._losses))
            self._losses.clear()
        self._score_deferred()
        if self._metrics:
            self.metric_sum.add_(torch.stack(self._metrics).to(torch.float64).sum())
            self._metrics.clear()
        if self._mirrored:
            self.slot.fill_(self._slot)
            self.applied_steps.fill_(self._applied)

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
        self._flush()
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
        """The counters as tensors, up to date, for a caller that reads them or writes them whole
        (a checkpoint, a snapshot): after a write, call `restored()`."""
        self._flush()
        return {"step_losses": self.step_losses, "slot": self.slot, "metric_sum": self.metric_sum,
                "skipped": self.skipped, "applied_steps": self.applied_steps}


def _stackable(kept: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether a batch concatenates with the kept ones (only the batch dimension may differ)."""
    return (kept[0].shape[1:] == output.shape[1:] and kept[0].dtype == output.dtype
            and kept[1].shape[1:] == y.shape[1:] and kept[1].dtype == y.dtype)
