"""A user's text data as Hugging Face `datasets` hold it: short reviews whose class is whether they
say 'good' or 'bad', character-tokenised with `Dataset.map`, in `with_format("torch")` (dict rows
of `input_ids` and `label`), and a bag-of-characters model for it (tests/test_user_data.py)."""

import numpy as np
from torch import nn

WORDS = ["the", "film", "was", "plot", "very", "acting", "quite", "so"]
LENGTH = 40


def reviews(n: int, seed: int):
    """(a datasets.Dataset of n tokenised reviews, the vocabulary size with padding id 0)."""
    import datasets
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    texts = [" ".join([*rng.choice(WORDS, 3), ("good", "bad")[k], *rng.choice(WORDS, 2)]) for k in labels]
    vocab = {c: i + 1 for i, c in enumerate(sorted(set("".join(WORDS + ["good", "bad"])) | {" "}))}

    def tokenise(row):   # a tiny character tokenizer, padded to LENGTH ids
        ids = [vocab[c] for c in row["text"]][:LENGTH]
        return {"input_ids": ids + [0] * (LENGTH - len(ids))}
    table = datasets.Dataset.from_dict({"text": texts, "label": labels.tolist()})
    return table.map(tokenise).remove_columns("text").with_format("torch"), len(vocab) + 1


class BagOfChars(nn.Module):
    def __init__(self, vocab: int, classes: int = 2):
        super().__init__()
        self.embed, self.head = nn.EmbeddingBag(vocab, 16, padding_idx=0), nn.Linear(16, classes)

    def forward(self, ids):
        return self.head(self.embed(ids))

