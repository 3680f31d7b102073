"""One small classification data set in the four kinds of batch a user's data comes in: tensors
(arrays, the device-resident path), tuples (a map-style Dataset's `(x, y)` samples), dicts (rows
of named fields, the target under `label`) and a Hugging Face `BatchEncoding` (what a tokenizer's
padding collate returns), and a model that takes each (tests/test_batch_kinds.py)."""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SAMPLES, FEATURES, CLASSES, TRAIN = 192, 8, 3, 160


def _arrays():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return x, y


class Pairs(Dataset):
    def __init__(self, part: slice):
        x, y = _arrays()
        self.x, self.y = x[part], y[part]

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Rows(Pairs):
    def __getitem__(self, i):
        return {"features": self.x[i], "label": self.y[i]}


def encode(rows):
    """A padding collate as a tokenizer's: the batch as a BatchEncoding, its target under `labels`."""
    from transformers import BatchEncoding
    return BatchEncoding({"features": torch.stack([r["features"] for r in rows]),
                          "labels": torch.stack([r["label"] for r in rows])})


def tensors():
    x, y = _arrays()
    return {"train": (x[:TRAIN], y[:TRAIN]), "val": (x[TRAIN:], y[TRAIN:])}


def tuples():
    return {"train": Pairs(slice(0, TRAIN)), "val": Pairs(slice(TRAIN, None))}


def dicts():
    return {"train": Rows(slice(0, TRAIN)), "val": Rows(slice(TRAIN, None))}


def encodings():
    return {"train": DataLoader(Rows(slice(0, TRAIN)), batch_size=32, shuffle=True, collate_fn=encode),
            "val": DataLoader(Rows(slice(TRAIN, None)), batch_size=32, collate_fn=encode)}


class Net(nn.Module):
    """Takes its one input positionally or by its field's name."""

    def __init__(self, classes: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, features):
        return self.body(features)


def model(input_shape, num_classes):
    return Net(num_classes)


def loaders_of_16():
    """Tuples through the user's own DataLoaders of 16: the batch every command must read."""
    return {"train": DataLoader(Pairs(slice(0, TRAIN)), batch_size=16, shuffle=True),
            "val": DataLoader(Pairs(slice(TRAIN, None)), batch_size=16)}
