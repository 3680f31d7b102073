"""A character-level corpus made offline from text the Python standard library ships: the help
topics of `pydoc_data.topics` (~465k characters of Python documentation), so a language model
trains with no download.

The text is cut into train / validation / test by position (90 / 5 / 5 per cent, in that order),
never shuffled across the cuts, so no validation window overlaps a training one. Each split
becomes windows of `seq_len + 1` characters: x = the first `seq_len`, y = the same shifted by one
(the next character at every position). Training windows overlap by half (twice the samples from
the same text); validation and test windows do not.
"""

from __future__ import annotations

import torch

from scaletrain.data.dataset import ArraySplit, Dataset, make_dataset
from scaletrain.data.source import register_dataset
from scaletrain.errors import DataError

SPLITS = (0.90, 0.05, 0.05)


def pydoc_text() -> str:
    import pydoc_data.topics as topics
    return "".join(topics.topics[key] for key in sorted(topics.topics))


def windows(ids: torch.Tensor, seq_len: int, stride: int) -> ArraySplit:
    if len(ids) < seq_len + 1:
        raise DataError(f"char-corpus: a split of {len(ids)} characters is shorter than one window of "
                        f"{seq_len + 1}; use a smaller --seq-len")
    w = ids.unfold(0, seq_len + 1, stride)
    return ArraySplit(w[:, :-1].contiguous(), w[:, 1:].contiguous())


def load_char_corpus(seq_len: int, text: str | None = None) -> Dataset:
    text = pydoc_text() if text is None else text
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    ids = torch.tensor([index[ch] for ch in text], dtype=torch.int64)
    n = len(ids)
    a, b = int(n * SPLITS[0]), int(n * (SPLITS[0] + SPLITS[1]))
    train = windows(ids[:a], seq_len, max(seq_len // 2, 1))
    val = windows(ids[a:b], seq_len, seq_len)
    test = windows(ids[b:], seq_len, seq_len)
    return make_dataset("char-corpus", train, test, num_classes=len(vocab), val=val, task="language-model")


@register_dataset("char-corpus", sample=lambda cfg: ((cfg.seq_len,), len(set(pydoc_text())), "language-model"))
def _char_corpus(cfg, seed: int) -> Dataset:
    return load_char_corpus(cfg.seq_len)
