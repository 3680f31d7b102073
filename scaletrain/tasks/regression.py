"""Regression: real-valued targets, mean squared error, scored by R² and mean absolute error."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from scaletrain.tasks.base import Task, register_task


def _match(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A model emits (N, k); a single target per sample is stored as (N,)."""
    return output.float().reshape(target.shape)


@register_task("regression")
class Regression(Task):
    metrics = {"loss": False, "mae": False, "r2": True}
    default_target = "r2"
    train_metric = "mae"
    combined = "averaged outputs"
    n_sums = 5   # squared error, absolute error, sum y, sum y^2, count
    class_outputs = False   # one output per real-valued target

    def loss(self, output, target):
        return F.mse_loss(_match(output, target), target.float())

    def train_metric_sum(self, output, target):
        return (_match(output.detach(), target) - target).abs().sum()

    def eval_sums(self, output, target):
        out, y = _match(output, target).double(), target.double()
        err = out - y
        return torch.stack([(err * err).sum(), err.abs().sum(), y.sum(), (y * y).sum(),
                            torch.tensor(float(y.numel()), dtype=torch.float64, device=y.device)])

    def eval_metrics(self, sums):
        sse, sae, sy, syy, n = sums
        n = max(n, 1)
        total = syy - sy * sy / n   # the targets' spread around their mean
        return {"loss": sse / n, "mae": sae / n, "r2": 1 - sse / total if total > 0 else float("nan")}

    def example_batch(self, batch, input_shape, output_size, input_dtype):
        x = torch.empty((batch, *input_shape), dtype=input_dtype)
        return x, torch.zeros((batch,) if output_size == 1 else (batch, output_size))

    def predictions(self, output):
        return output.float()

    def output_of_predictions(self, predictions):
        return predictions
