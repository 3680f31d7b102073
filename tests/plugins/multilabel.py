"""A user's own task in a module of theirs: multi-label classification (several labels per
sample), BCE with logits, micro-F1 (tests/test_user_task.py; docs/your-task.md shows the same)."""

import torch
import torch.nn.functional as F
from torch import nn

from scaletrain.tasks import Task


class MultiLabel(Task):
    metrics = {"loss": False, "f1": True}      # name -> higher is better
    default_target = "f1"                      # what --target refers to
    n_sums = 5                                 # loss, true positives, false positives, false negatives, samples

    def loss(self, output, target):
        return F.binary_cross_entropy_with_logits(output.float(), target)

    def eval_sums(self, output, target):
        predicted, truth = output > 0, target > 0.5
        sums = [F.binary_cross_entropy_with_logits(output.float(), target, reduction="sum") / target.shape[1],
                (predicted & truth).sum(), (predicted & ~truth).sum(), (~predicted & truth).sum(),
                torch.tensor(target.shape[0], device=target.device)]
        return torch.stack([s.double() for s in sums])

    def eval_metrics(self, sums):
        loss, tp, fp, fn, n = sums
        return {"loss": loss / max(n, 1), "f1": 2 * tp / max(2 * tp + fp + fn, 1)}

    def predictions(self, output):
        return torch.sigmoid(output.float())

    def output_of_predictions(self, predictions):
        return torch.logit(predictions.float(), eps=1e-7)


def arrays(n=2400, labels=5):
    """Features whose labels are which of `labels` random directions they point along, as
    (inputs, targets) pairs of tensors (normalised by the trainer with the training statistics)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    y = (x @ torch.randn(16, labels, generator=g) > 0.5).float()
    return {"train": (x[:1600], y[:1600]), "val": (x[1600:2000], y[1600:2000]), "test": (x[2000:], y[2000:])}


def splits(n=2400, labels=5):
    """The same samples as torch Datasets (read as they are: no statistics)."""
    from torch.utils.data import TensorDataset
    return {name: TensorDataset(*pair) for name, pair in arrays(n, labels).items()}


def build(input_shape, num_classes, hidden=64):
    return nn.Sequential(nn.Linear(input_shape[-1], hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


class NotATask:
    metrics = {"loss": False}


class NoSums(Task):
    metrics = {"loss": False}

    def loss(self, output, target):
        return F.binary_cross_entropy_with_logits(output.float(), target)


class Colliding(MultiLabel):
    train_metric = "loss"

    def train_metric_sum(self, output, target):
        return output.sum()


class PerSampleLoss(MultiLabel):
    def loss(self, output, target):   # forgot the mean: a loss per sample
        return F.binary_cross_entropy_with_logits(output.float(), target, reduction="none").mean(1)


class NoDefaultTarget(Task):   # metrics without a loss, and no default_target of its own
    metrics = {"f1": True}
    n_sums = 5
    loss, eval_sums, eval_metrics = MultiLabel.loss, MultiLabel.eval_sums, MultiLabel.eval_metrics
