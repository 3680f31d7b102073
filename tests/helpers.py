import copy

import torch
from torch import nn

from scaletrain.models import build_model
from scaletrain.training import Trainer


def make_mlp(dataset, seed=0, hidden=(64,)):
    torch.manual_seed(seed)
    return build_model("mlp", dataset.input_shape, dataset.num_classes, hidden=list(hidden))


def fit(cfg, dataset, callbacks=(), model=None, ckpt=None):
    model = model if model is not None else make_mlp(dataset, cfg.seed)
    trainer = Trainer(model, cfg, callbacks, checkpointer=ckpt)
    trainer.fit(dataset)
    return trainer


def weights(model: nn.Module) -> dict:
    return {k: v.detach().clone().float() for k, v in model.state_dict().items()}


class Poison(nn.Module):
    """Wraps a model; multiplies its logits by `factor` (set to inf to inject an overflow)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.factor = 1.0

    def forward(self, x):
        out = self.inner(x)
        return out * self.factor if self.factor != 1.0 else out


class PoisonAt:
    """Callback: poisons exactly the training step with 0-based index `step` and records what the
    weights, applied-step counter and LR were around it (steps_per_execution must be 1)."""

    def __init__(self, model: Poison, step: int):
        self.model, self.step = model, step
        self.records = {}

    def on_train_batch_begin(self, trainer, step):
        self.model.factor = float("inf") if step == self.step else 1.0
        if step in (self.step, self.step + 1):
            self.records[step] = {"before": copy.deepcopy(trainer.model.state_dict()),
                                  "applied_before": trainer.counters.applied()}

    def on_train_batch_end(self, trainer, step, logs):
        done = step - 1  # index of the step that just ran
        if done in self.records:
            r = self.records[done]
            r["after"] = copy.deepcopy(trainer.model.state_dict())
            r["applied_after"] = trainer.counters.applied()
            r["lr"] = float(trainer.optimizer.param_groups[0]["lr"])
        self.model.factor = 1.0
