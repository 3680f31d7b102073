"""A Hugging Face causal language model built from its config offline (GPT-2 style, two blocks,
random weights, no download) and a tokenised `datasets.Dataset` of its text: dict rows of
`input_ids`, `attention_mask` and `labels` (tests/test_user_task.py). The model computes its own
loss from `labels=`; no task code."""

import numpy as np

VOCAB, LENGTH = 48, 24


def _rows(n: int, seed: int):
    import datasets
    rng = np.random.default_rng(seed)
    start = rng.integers(0, VOCAB, (n, 1))
    ids = (start + np.arange(LENGTH) * rng.integers(1, 3, (n, 1))) % VOCAB   # counting sequences
    mask = np.ones_like(ids)
    return datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": mask.tolist(),
                                       "labels": ids.tolist()}).with_format("torch")


def splits(n=512):
    return {"train": _rows(n, 0), "val": _rows(128, 1)}


def build(input_shape, num_classes, layers=2):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=layers, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def build_logits_only(input_shape, num_classes):
    """A model whose forward takes labels= but returns no loss (what --task own-loss refuses)."""
    from torch import nn

    class LogitsOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, VOCAB)

        def forward(self, input_ids, attention_mask=None, labels=None):
            return {"logits": self.embed(input_ids)}
    return LogitsOnly()


def build_sync_free(input_shape, num_classes):
    """A model of Hugging Face's convention (named inputs, labels=, an output with .loss and
    .logits) whose forward never reads a tensor back to the host, unlike transformers' GPT-2 (its
    mask and packed-sequence checks do): what the no-host-sync test of the step runs."""
    from dataclasses import dataclass

    import torch
    import torch.nn.functional as F
    from torch import nn

    @dataclass
    class Output:
        loss: torch.Tensor | None
        logits: torch.Tensor

    class TinyCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.mix, self.head = nn.Embedding(VOCAB, 32), nn.Linear(32, 32), nn.Linear(32, VOCAB)

        def forward(self, input_ids, attention_mask=None, labels=None, use_cache=None):
            h = self.embed(input_ids)
            if attention_mask is not None:
                h = h * attention_mask[..., None]
            logits = self.head(torch.relu(self.mix(h.cumsum(1))))
            loss = None
            if labels is not None:
                loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
            return Output(loss, logits)
    return TinyCausalLM()
