"""A model that computes its own loss (Hugging Face's convention): its forward takes the batch's
inputs by name and the targets as `labels=`, and returns an output with `.loss`, the batch's mean.
Trained with no task code; scored by that loss, and perplexity (exp of the mean loss) where the
targets are token sequences. Chosen by `--task auto` for a model whose forward takes `labels`.

Evaluation weights each batch's mean loss by its samples: exact over ranks and batches when the
model's loss is a mean over samples; a causal LM's mean over the tokens that count (labels not
-100) is weighted by samples too, so padded batches count as their samples, not their tokens.
"""

from __future__ import annotations

import inspect
import math

import torch

from scaletrain.errors import ConfigError
from scaletrain.inputs import Inputs, batch_rows
from scaletrain.tasks.base import Task, register_task


def _first_parameter(model) -> str:
    """The name the model's forward gives its first input (`input_ids`, `pixel_values`): where a
    sample's single input goes when the targets go by name."""
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return params[0].name if params else "input_ids"


@register_task("own-loss")
class OwnLoss(Task):
    metrics = {"loss": False}
    default_target = "loss"
    train_metric = ""
    n_sums = 2   # loss x samples, samples
    any_targets = True

    def __init__(self, input_name: str = "input_ids", tokens: bool = False, keywords: dict | None = None):
        self.input_name = input_name
        self.keywords = keywords or {}   # fixed keyword arguments of every call
        if tokens:   # next-token targets: perplexity is the language model's figure
            self.metrics = {"loss": False, "perplexity": False}
            self.default_target = "perplexity"

    @classmethod
    def for_model(cls, model, dataset_task: str) -> OwnLoss:
        """The task for `model`, checked to take labels=; with no model yet (what sizes its output
        before it is built) unchecked: it is checked again once built."""
        if model is None:
            return cls(tokens=dataset_task == "language-model")
        if "labels" not in inspect.signature(model.forward).parameters:
            raise ConfigError(f"--task own-loss: {type(model).__name__}'s forward takes no labels=; the model's own "
                              "loss needs a forward(..., labels=None) returning an output with .loss")
        # No key/value cache: training never reads one, and activation checkpointing's recomputation
        # of a block would extend it a second time (a shape error in the backward).
        params = inspect.signature(model.forward).parameters
        keywords = {"use_cache": False} if "use_cache" in params else {}
        return cls(_first_parameter(model), tokens=dataset_task == "language-model", keywords=keywords)

    def forward(self, model, x):
        return model(**x, **self.keywords)

    def model_inputs(self, x: Inputs, y: torch.Tensor) -> Inputs:
        inputs = dict(x) if isinstance(x, dict) else {self.input_name: x}
        inputs["labels"] = y
        return inputs

    def loss(self, output, target):
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if loss is None:
            raise ConfigError(f"the model returned {type(output).__name__} without .loss: a model trained on its "
                              "own loss must compute it from labels= (or name a task with --task)")
        return loss.float() if isinstance(loss, torch.Tensor) else loss

    def eval_sums(self, output, target):
        rows = float(batch_rows(target))
        return torch.stack([self.loss(output, target).double() * rows,
                            torch.tensor(rows, dtype=torch.float64, device=target.device)])

    def eval_metrics(self, sums):
        total, rows = sums
        mean = total / max(rows, 1)
        logs = {"loss": mean}
        if "perplexity" in self.metrics:
            logs["perplexity"] = math.exp(min(mean, 700.0))
        return logs

    @classmethod
    def scores_predictions(cls) -> str:
        return "its metric is the model's own loss, which predictions (a mean of several models') do not carry"

    def predictions(self, output):
        logits = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", None)
        if logits is None:
            raise ConfigError(f"the model returned {type(output).__name__} without .logits to predict from")
        return torch.softmax(logits.float(), dim=-1)
