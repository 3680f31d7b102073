"""Next-token language modelling: a sequence of token ids in, the next token at every position
out. Token cross-entropy; perplexity (exp of the mean token loss) and token accuracy."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from scaletrain.tasks.base import Task, register_task


@register_task("language-model")
class LanguageModel(Task):
    metrics = {"loss": False, "perplexity": False, "accuracy": True}
    default_target = "perplexity"
    train_metric = "accuracy"
    combined = "averaged token distributions"
    n_sums = 3   # token loss, correct tokens, tokens
    vocabulary = True            # the class count is the vocabulary
    normalised_inputs = False    # token ids are indices into the embedding

    def loss(self, output, target):
        # (N, T, V) logits against (N, T) next tokens, every position weighted alike.
        return F.cross_entropy(output.float().flatten(0, 1), target.flatten())

    def train_metric_sum(self, output, target):
        return (output.detach().argmax(dim=-1) == target).sum()

    def eval_sums(self, output, target):
        return torch.stack([F.cross_entropy(output.float().flatten(0, 1), target.flatten(), reduction="sum").double(),
                            (output.argmax(dim=-1) == target).sum().double(),
                            torch.tensor(float(target.numel()), dtype=torch.float64, device=target.device)])

    def example_batch(self, batch, input_shape, output_size, input_dtype):
        tokens = torch.empty((batch, *input_shape), dtype=torch.int64).random_(output_size)
        return tokens, tokens.clone()

    def eval_metrics(self, sums):
        loss, right, count = sums
        mean = loss / max(count, 1)
        return {"loss": mean, "perplexity": math.exp(min(mean, 700.0)), "accuracy": right / max(count, 1)}
