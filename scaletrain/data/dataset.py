"""In-memory data sets: a train and a test split of tensors, plus training-split statistics."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch

from scaletrain.errors import DataError
from scaletrain.inputs import map_inputs, tensors
from scaletrain.tasks import targets_of


@dataclass(slots=True)
class ArraySplit:
    """Samples `x` (N, C, ...) and their targets `y`: integer labels (N,) for classification, real
    values (N,) or (N, k) for regression, next-token ids (N, T) for a language model. Images may
    stay uint8 until the device; token ids stay int64."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)

    # What every split offers (data/user.py's TorchSplit too): a range of it, and its first samples.
    def part(self, start: int, end: int) -> ArraySplit:
        """Samples [start, end) (views, no copy)."""
        return ArraySplit(map_inputs(lambda t: t[start:end], self.x), self.y[start:end])

    def head(self, n: int) -> ArraySplit:
        """The first `n` samples."""
        return self.part(0, n)

    def pieces(self, bounds: list[int]) -> Iterator[ArraySplit]:
        """Samples [bounds[i], bounds[i + 1]) after one another, as tensors (the shard writer's)."""
        return (self.part(start, end) for start, end in pairwise(bounds))


@dataclass(slots=True)
class Dataset:
    name: str
    train: ArraySplit     # or a ShardedSplit (data/shards), streamed from disk: only its length is known here
    test: ArraySplit
    num_classes: int
    # Featurewise centring (seed 003): per-channel mean/std of the *training* split, shaped to
    # broadcast against one sample (C, 1, ...). None for token ids, which are indices, not features.
    mean: torch.Tensor | None
    std: torch.Tensor | None
    # Held out of the training split: drives per-epoch evaluation, stopping and tuning, so the
    # test split is looked at once, at the end (None: a data set built without one).
    val: ArraySplit | None = None
    # What the targets are for (a registered task's name): classification, regression, language-model.
    task: str = "classification"
    # The test split was held out as one. False where the data had no test split and its validation
    # split (given, or held out of train) stands in: it is then named val wherever it is shown or
    # asked for, and no figure is reported as a test figure.
    test_held_out: bool = True

    @property
    def loader_batch(self) -> int | None:
        """The per-process batch the user's training DataLoader fixes, or None where the trainer
        batches the data (distributed/batching.py: `loader_batch`)."""
        return getattr(self.train, "batch_size", None)

    def split_names(self) -> dict[str, ArraySplit]:
        """The splits by the names the user knows them by: train, val (given or held out), test
        (where one was)."""
        named = {"train": self.train}
        if self.val is not None:
            named["val"] = self.val
        named["val" if not self.test_held_out else "test"] = self.test
        return named

    def split(self, name: str):
        """The split the user calls `name`, or a one-line refusal naming those there are."""
        named = self.split_names()
        if name not in named:
            raise DataError(f"{self.name} has no {name} split (it has {', '.join(named)}); use --split "
                            f"{' or '.join(named)}")
        return named[name]

    def describe_splits(self) -> str:
        """'512 train / 128 val / 64 test' (the start line's), by the user's names."""
        return " / ".join(f"{len(split)} {name}" for name, split in self.split_names().items())

    @property
    def examples(self) -> ArraySplit:
        """In-memory samples shaped like the training samples: the training split itself, its first
        samples where a torch Dataset holds it (data/user.py), or the test split where it streams
        from shards."""
        if isinstance(self.train, ArraySplit):
            return self.train
        return getattr(self.train, "examples", None) or self.test

    @property
    def example(self) -> tuple:
        """(inputs, targets) of the first two training samples: what the planners shape an example
        batch of any size like (token ids, several named inputs, the targets' form)."""
        head = self.examples.head(2)
        # Features with statistics reach the model as floats (the normaliser casts them).
        x = head.x if self.mean is None else map_inputs(lambda t: t.float(), head.x)
        return x, head.y

    @property
    def token_inputs(self) -> bool:
        """Inputs are indices (token ids), not features: integers without feature statistics."""
        return self.mean is None and not tensors(self.examples.x)[0].is_floating_point()

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample's shape (of several named inputs, the first's: what a model builder is given)."""
        return tuple(tensors(self.examples.x)[0].shape[1:])


def as_features(x: np.ndarray | torch.Tensor, source: str) -> torch.Tensor:
    """Converts features to a tensor; float64 becomes float32 explicitly (seed 000's pitfall:
    a float64 input silently turns a mixed-precision run into a float64 one)."""
    t = torch.from_numpy(np.ascontiguousarray(numeric(x, source, "features"))) if isinstance(x, np.ndarray) else x
    if not isinstance(t, torch.Tensor):
        raise DataError(f"{source}: features must be an array or a tensor, got {type(t).__name__}")
    if t.dtype == torch.uint8:
        return t
    if not (t.is_floating_point() or t.dtype in (torch.int8, torch.int16, torch.int32, torch.int64)):
        raise DataError(f"{source}: features have unsupported dtype {t.dtype}")
    t = t.to(torch.float32)
    bad = int((~torch.isfinite(t)).sum())
    if bad:
        raise DataError(f"{source}: {bad} feature value(s) are inf or NaN (or overflow float32); "
                        "clean or impute them before training")
    return t


def numeric(x: np.ndarray, source: str, what: str) -> np.ndarray:
    """`x`, refused in one line where NumPy holds Python objects in it (dtype object: rows of
    different lengths, or arrays inside an array), which no tensor can hold."""
    if x.dtype == object:
        raise DataError(f"{source}: the {what} are a NumPy array of Python objects (dtype object: rows of different "
                        "lengths, or arrays inside an array); stack them into one numeric array (np.stack), or give "
                        "a torch Dataset whose samples are tensors")
    return x


def as_labels(y: np.ndarray | torch.Tensor, n: int, num_classes: int | None, source: str) -> torch.Tensor:
    """Checks labels are integers in [0, num_classes) and match the sample count."""
    t = torch.from_numpy(np.ascontiguousarray(numeric(y, source, "labels"))) if isinstance(y, np.ndarray) else y
    if t.ndim != 1:
        raise DataError(f"{source}: labels must be a 1-D array, got shape {tuple(t.shape)}")
    if len(t) != n:
        raise DataError(f"{source}: {len(t)} labels for {n} samples (shape mismatch)")
    if t.is_floating_point():
        if not torch.equal(t, t.round()):
            raise DataError(f"{source}: labels must be integers, found fractional values")
    t = t.to(torch.int64)
    if len(t):
        low, high = int(t.min()), int(t.max())
        limit = num_classes if num_classes is not None else high + 1
        if low < 0 or high >= limit:
            bad = low if low < 0 else high
            raise DataError(f"{source}: label {bad} is out of range [0, {limit})")
    return t


# Inferred class counts: a model gets one output per class up to the largest label, so a stray huge
# label would allocate a huge head. Labels must be (nearly) dense: 0..K-1 with at most this many
# unused values, or the file states its class count.
MAX_UNUSED_CLASSES = 1000


def infer_num_classes(y: torch.Tensor, source: str) -> int:
    """Classes = largest label + 1, refused when most of those classes would never be seen."""
    if len(y) == 0:
        raise DataError(f"{source}: no labels")
    highest, distinct = int(y.max()), int(torch.unique(y).numel())
    if highest + 1 - distinct > MAX_UNUSED_CLASSES:
        raise DataError(f"{source}: labels go up to {highest} but only {distinct} distinct values occur; relabel them "
                        f"to 0..{distinct - 1}, or store the class count as num_classes in the file")
    return max(highest + 1, 2)


def with_channel_dim(x: torch.Tensor, sample_ndim: int) -> torch.Tensor:
    """(N, L) -> (N, 1, L) and (N, H, W) -> (N, 1, H, W): models expect an explicit channel dim."""
    return x.unsqueeze(1) if x.ndim == sample_ndim + 1 else x


def make_dataset(name: str, train: ArraySplit, test: ArraySplit, num_classes: int,
                 val: ArraySplit | None = None, task: str = "classification") -> Dataset:
    """Computes per-channel normalisation statistics from the training split only (none for
    token ids: a language model's inputs are indices into its embedding)."""
    if train.x.shape[1:] != test.x.shape[1:]:
        raise DataError(f"{name}: train samples have shape {tuple(train.x.shape[1:])} but test samples "
                        f"{tuple(test.x.shape[1:])} (shape mismatch)")
    if len(train) == 0:
        raise DataError(f"{name}: the training split is empty")
    if not targets_of(task).normalised_inputs:
        return Dataset(name=name, train=train, test=test, num_classes=num_classes, mean=None, std=None, val=val,
                       task=task)
    x = train.x.to(torch.float64)
    dims = [0] + list(range(2, x.ndim))
    mean = x.mean(dim=dims, keepdim=True)[0].to(torch.float32)
    std = x.std(dim=dims, keepdim=True)[0].clamp_min(1e-6).to(torch.float32)
    return Dataset(name=name, train=train, test=test, num_classes=num_classes, mean=mean, std=std, val=val,
                   task=task)


def held_out(n: int, fraction: float, seed: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, held out) indices, each sorted: a seeded random `fraction` of `n` samples held out, at
    least one, and at least one kept."""
    if n < 2:
        raise DataError(f"{name}: {n} training sample(s) cannot be split into train and validation")
    n_out = min(max(1, round(n * fraction)), n - 1)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[n_out:].sort().values, perm[:n_out].sort().values


def hold_out_validation(ds: Dataset, fraction: float, seed: int = 0) -> Dataset:
    """Moves a seeded random `fraction` of the training split into a validation split (at least
    one sample, and at least one left to train on); statistics are recomputed on what remains.
    The seed is fixed by default so runs with different training seeds validate on the same samples."""
    train_idx, val_idx = held_out(len(ds.train), fraction, seed, ds.name)
    train = ArraySplit(ds.train.x[train_idx], ds.train.y[train_idx])
    val = ArraySplit(ds.train.x[val_idx], ds.train.y[val_idx])
    return make_dataset(ds.name, train, ds.test, ds.num_classes, val=val, task=ds.task)


def random_split(x: torch.Tensor, y: torch.Tensor, test_fraction: float, seed: int) -> tuple[ArraySplit, ArraySplit]:
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=g)
    n_test = max(1, round(len(y) * test_fraction))
    test_idx, train_idx = perm[:n_test], perm[n_test:]
    return ArraySplit(x[train_idx], y[train_idx]), ArraySplit(x[test_idx], y[test_idx])
