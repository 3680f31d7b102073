"""Classification: one label per sample, cross-entropy on the logits, accuracy (the default)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from scaletrain.tasks.base import Task, register_task


@register_task("classification")
class Classification(Task):
    metrics = {"loss": False, "accuracy": True}
    default_target = "accuracy"
    train_metric = "accuracy"
    combined = "averaged probabilities"
    n_sums = 3   # loss, correct, count
    integer_labels = True

    def loss(self, output, target):
        # The softmax and the loss in float32: fp16 softmax saturates (seed 000).
        return F.cross_entropy(output.float(), target)

    def train_metric_sum(self, output, target):
        return (output.detach().argmax(dim=-1) == target).sum()

    def eval_sums(self, output, target):
        return torch.stack([F.cross_entropy(output.float(), target, reduction="sum").double(),
                            (output.argmax(dim=-1) == target).sum().double(),
                            torch.tensor(float(target.numel()), dtype=torch.float64, device=target.device)])

    def eval_metrics(self, sums):
        loss, right, count = sums
        return {"loss": loss / max(count, 1), "accuracy": right / max(count, 1)}
