"""Data as users hold it: a torch `Dataset` (map-style), an `IterableDataset` (a stream), a
`DataLoader` of either, or arrays, made into our `Dataset` of splits. The trainer then batches it
as its own (data/loaders.py): seeded shuffling per epoch (a stream: its own order), each replica
its share of every global batch, a resumed run at the very sample it stopped at.

A sample (or a DataLoader's batch) is an `(input, target)` pair, or a dict (or dataclass) with one
target key (`TARGET_KEYS`) and one input key, the form Hugging Face `datasets` yield. The task is
the data's own where it states one (a `task` attribute), else the one asked for, else read off
the targets: integers are class labels (one per sample) or token ids (a sequence per sample),
floats are regression targets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
import sys
from collections.abc import Callable, Iterator, Mapping
from itertools import pairwise
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler, Subset, get_worker_info
from torch.utils.data import Dataset as TorchDataset

from scaletrain.data.dataset import (
    ArraySplit,
    Dataset,
    as_features,
    as_labels,
    held_out,
    hold_out_validation,
    infer_num_classes,
    make_dataset,
    numeric,
)
from scaletrain.errors import DataError, add_context
from scaletrain.tasks import targets_of

# The keys a dict sample's target goes by (Hugging Face's `labels`/`label`, and the usual others).
TARGET_KEYS = ("labels", "label", "targets", "target", "y")
# Samples collated to learn shapes, dtypes and the task: a few, never the whole set.
EXAMPLE_SAMPLES = 2


def split_batch(batch: Any, source: str = "a batch") -> tuple[Any, torch.Tensor]:
    """(inputs, target) of a sample or batch: a pair, or a dict/dataclass with one target key."""
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        batch = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    if isinstance(batch, Mapping):
        targets = [k for k in TARGET_KEYS if k in batch]
        if not targets:
            raise DataError(f"{source}: a dict sample needs its target under one of {', '.join(TARGET_KEYS)}; "
                            f"found keys {', '.join(map(str, batch))}")
        if len(targets) > 1:
            raise DataError(f"{source}: a dict sample needs one target key, found {', '.join(targets)}; "
                            "drop or rename the others (e.g. datasets' remove_columns)")
        inputs = [k for k in batch if k not in TARGET_KEYS]
        if not inputs:
            raise DataError(f"{source}: a dict sample needs an input beside its target '{targets[0]}'")
        # One input is passed to the model positionally; several by name (inputs.py).
        x = batch[inputs[0]] if len(inputs) == 1 else {k: batch[k] for k in inputs}
        return x, batch[targets[0]]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise DataError(f"{source}: a sample must be an (input, target) pair or a dict with a target key, "
                    f"got {type(batch).__name__}")


def collate_pairs(collate: Callable | None, classes: int | None = None) -> Callable:
    """The user's collate (or torch's default), then (inputs, target) as tensors: what the loaders
    move to the device. Class labels are checked against `classes` here, on the host, where it
    costs no device synchronisation (a bad label would otherwise fail inside the loss)."""
    from torch.utils.data import default_collate

    own = collate is not None

    def pairs(samples):
        try:
            batch = (collate or default_collate)(samples)
        except (RuntimeError, TypeError, ValueError) as exc:
            if own:    # the user's collate_fn raised: theirs to see, as their code (user_code/failures.py)
                add_context(exc, f"collating a batch of {len(samples)} samples")
                raise
            raise DataError(f"collating a batch failed: {str(exc).splitlines()[0]} (samples of different shapes? "
                            "make them equal, or give a collate_fn that pads them)") from None
        x, y = split_batch(batch)
        x = {k: _tensor(v, f"input '{k}'") for k, v in x.items()} if isinstance(x, Mapping) else _tensor(x, "inputs")
        y = _tensor(y, "targets")
        if classes and not y.is_floating_point() and y.numel():
            low, high = int(y.min()), int(y.max())
            if low < 0 or high >= classes:
                raise DataError(f"label {low if low < 0 else high} is out of range [0, {classes}) for a "
                                f"{classes}-class task; relabel, or state num_classes on the data set")
        return x, y
    return pairs


def _tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError, RuntimeError):
        first = value[0] if isinstance(value, (list, tuple)) and value else value
        raise DataError(f"samples must hold tensors, arrays or numbers; their {what} are "
                        f"{type(first).__name__} (turn them into tensors in __getitem__ or a collate_fn)") from None


@contextlib.contextmanager
def kept_random_state():
    """torch's, Python's and NumPy's global random streams as they were after the block: reading a
    sample in the training process never shifts the model's dropout or initialisation."""
    python, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy_state)


class SeededSamples(TorchDataset):
    """A user's samples, each batch read under a seed of its own (the run's seed, the epoch, the
    batch's first sample): a random transform (crop, flip) draws the same for a batch wherever it is
    read, by whichever worker (a DataLoader worker reads whole batches), so a resumed run, or one
    with another worker count, sees exactly the uninterrupted run's batches. Its keys are (epoch,
    index) pairs (`_Positions` in data/loaders.py). Once a batch, not once a sample: seeding
    torch's, Python's and NumPy's generators, and keeping the training process's, costs ~0.2 ms."""

    def __init__(self, dataset: TorchDataset, seed: int):
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]):
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list[tuple[int, int]]) -> list:
        epoch, first = keys[0]
        seed = batch_seed(self.seed, epoch, first)
        if get_worker_info() is not None:   # a loader worker: its streams are its own
            _seed_all(seed)
            return self._read([index for _, index in keys])
        with kept_random_state():
            _seed_all(seed)
            return self._read([index for _, index in keys])

    def _read(self, indices: list[int]) -> list:
        # A set that reads many samples at once (`__getitems__`: Hugging Face's, torch's Subset) does
        # so, as torch's DataLoader would: a Hugging Face row read alone costs its whole formatting.
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is None:
            return [read_sample(self.dataset, i) for i in indices]
        try:
            return list(getitems(indices))
        except Exception as exc:
            add_context(exc, f"reading samples {indices[0]}..{indices[-1]} of {len(self.dataset)}")
            raise


def read_sample(dataset, i: int):
    """`dataset[i]`; what the user's __getitem__ raises says which sample it was reading."""
    try:
        return dataset[i]
    except Exception as exc:
        add_context(exc, f"reading sample {i} of the {len(dataset)} its __len__ gives")
        raise


def counted_records(stream, first: int = 0) -> Iterator:
    """The samples of a stream; what the user's __iter__ raises says which record it was reading."""
    records, position = iter(stream), first
    while True:
        try:
            sample = next(records)
        except StopIteration:
            return
        except Exception as exc:
            add_context(exc, f"reading record {position} of the stream")
            raise
        yield sample
        position += 1


def batch_seed(seed: int, epoch: int, first: int) -> int:
    """The seed a batch of a user's samples is read under: the run's seed, the epoch and the
    position of the batch's first sample (map-style sets and streams alike)."""
    return ((seed * 100_003 + epoch) * 1_000_003 + first) % (2 ** 32)


def _seed_all(seed: int) -> None:
    # The default generator itself: torch.manual_seed also visits every accelerator's (290 us a call).
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


class TorchSplit:
    """One split held as a torch map-style Dataset, read through a DataLoader on the host: its
    collate function and worker count, and, when a DataLoader was given, its batch size."""

    def __init__(self, dataset: TorchDataset, name: str, collate_fn: Callable | None = None,
                 num_workers: int | None = None, batch_size: int | None = None):
        self.dataset, self.name, self.collate_fn = dataset, name, collate_fn
        self.num_workers, self.batch_size = num_workers, batch_size
        self.label_bound: int | None = None     # class labels lie in [0, label_bound), checked per batch
        self._examples: ArraySplit | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def samples(self) -> Iterator:
        """Every sample in order, as the user's set returns it (read in this process)."""
        return (read_sample(self.dataset, i) for i in range(len(self)))

    def part(self, start: int, end: int) -> TorchSplit:
        """Samples [start, end): one replica's evaluation range."""
        part = TorchSplit(Subset(self.dataset, range(start, end)), self.name, self.collate_fn, self.num_workers,
                          self.batch_size)
        part.label_bound = self.label_bound
        return part

    def pieces(self, bounds: list[int]) -> Iterator[ArraySplit]:
        """Samples [bounds[i], bounds[i + 1]) after one another, collated into tensors, one piece in
        memory at a time (the shard writer writes a set larger than memory this way)."""
        samples = itertools.islice(self.samples(), bounds[0], None)
        for start, end in pairwise(bounds):
            yield self._collated(samples, end - start)

    @property
    def examples(self) -> ArraySplit:
        """The first samples as tensors: their shapes, dtypes and targets stand for the split's."""
        if self._examples is None:
            self._examples = self.head(EXAMPLE_SAMPLES)
        return self._examples

    def head(self, n: int) -> ArraySplit:
        """The first `n` samples, collated into tensors (read as evaluation reads them)."""
        return next(self.pieces([0, min(n, len(self))]))

    def _collated(self, samples: Iterator, n: int) -> ArraySplit:
        """The next `n` of `samples` as tensors; whatever the user's code raises, in one line."""
        try:
            with kept_random_state():
                return ArraySplit(*collate_pairs(self.collate_fn)(list(itertools.islice(samples, n))))
        except DataError as exc:
            raise DataError(f"{self.name}: {exc}") from None
        # Anything else the user's __getitem__ or collate raised is theirs: shown with their frames
        # (user_code/failures.py), the sample named.


class StreamSplit(TorchSplit):
    """One split held as a torch IterableDataset: a stream, read in its own order (it has no random
    access: shuffle inside it), samples [start, end) of it. Its length is the set's `__len__`, else
    counted once by reading the stream through (said in the log). Each reader (a replica's
    DataLoader worker) passes over the stream and keeps its own batches (`StreamBatches`)."""

    def __init__(self, dataset: IterableDataset, name: str, collate_fn: Callable | None = None,
                 num_workers: int | None = None, batch_size: int | None = None, start: int = 0,
                 end: int | None = None):
        super().__init__(dataset, name, collate_fn, num_workers, batch_size)
        self.start, self.end = start, end

    def __len__(self) -> int:
        if self.end is None:
            try:
                self.end = len(self.dataset)
            except TypeError:   # no __len__: a stream of unknown length
                print(f"scaletrain: counting the samples of {self.name} by reading it through "
                      "(give the IterableDataset a __len__ to skip this)", file=sys.stderr, flush=True)
                with kept_random_state():
                    self.end = sum(1 for _ in self.dataset)
        return self.end - self.start

    def samples(self) -> Iterator:
        return itertools.islice(counted_records(self.dataset), self.start, self.start + len(self))

    def part(self, start: int, end: int) -> StreamSplit:
        part = StreamSplit(self.dataset, self.name, self.collate_fn, self.num_workers, self.batch_size,
                           self.start + start, self.start + end)
        part.label_bound = self.label_bound
        return part


class StreamBatches(IterableDataset):
    """One process's batches of a stream, as lists of samples: `batches` are (first, end) positions
    in the split, ascending; a DataLoader worker reads every `workers`-th of them (batch j by worker
    j mod workers, the order in which the DataLoader visits its workers, so they arrive in order)
    and passes over the others' samples. Each batch is read under a seed of its own, as
    `SeededSamples` reads one, so a resumed run or another worker count reads the same batches.
    A set with `set_epoch` (Hugging Face's streams) is told the epoch first."""

    def __init__(self, split: StreamSplit, seed: int):
        self.split, self.seed, self.epoch = split, seed, 0
        self.batches: list[tuple[int, int]] = []

    def __iter__(self):
        info = get_worker_info()
        mine = self.batches[info.id::info.num_workers] if info is not None else self.batches
        if not mine:
            return
        if hasattr(self.split.dataset, "set_epoch"):
            self.split.dataset.set_epoch(self.epoch)
        with _whole_stream():
            yield from self._read(mine, info is not None)

    def _read(self, mine: list[tuple[int, int]], in_worker: bool):
        stream, position = self.split.samples(), 0
        for first, end in mine:
            seed = batch_seed(self.seed, self.epoch, first)
            with (contextlib.nullcontext() if in_worker else kept_random_state()):
                skipped = sum(1 for _ in itertools.islice(stream, first - position))   # the others' samples
                _seed_all(seed)   # after the skip, which differs from reader to reader
                batch = list(itertools.islice(stream, end - first))
            if skipped + len(batch) < end - position:
                raise DataError(f"{self.split.name}: the stream ended after {position + skipped + len(batch)} samples "
                                f"but was counted as {len(self.split)}; its __len__ must match what it yields")
            position = end
            yield batch


@contextlib.contextmanager
def _whole_stream():
    """A stream read inside a DataLoader worker, seen by the user's set as read in the main
    process: a set that splits itself among workers (torch's documented pattern, Hugging Face's
    streams) yields all of it, and the trainer splits it (`StreamBatches`), the same way for every
    kind of stream. torch offers no public way to say this: its worker module's record of the
    worker is cleared while the stream is read."""
    from torch.utils.data._utils import worker
    info, worker._worker_info = worker._worker_info, None
    try:
        yield
    finally:
        worker._worker_info = info


def as_split(data: Any, name: str):
    """An ArraySplit (arrays or tensors in memory), a TorchSplit (anything read sample by sample) or
    a StreamSplit (an IterableDataset, read in its own order)."""
    if isinstance(data, (ArraySplit, TorchSplit)):
        return data
    if isinstance(data, DataLoader):
        if isinstance(data.dataset, IterableDataset):
            if data.batch_size is None:
                raise DataError(f"{name}: the DataLoader has batch_size=None (its IterableDataset yields batches); "
                                "the trainer batches the samples itself: yield samples and give batch_size=")
            return _nonempty(StreamSplit(data.dataset, name, data.collate_fn, data.num_workers, data.batch_size))
        if data.batch_sampler is not None and not isinstance(data.sampler, (SequentialSampler, RandomSampler)):
            raise DataError(f"{name}: the DataLoader has a sampler of its own ({type(data.sampler).__name__}); "
                            "the trainer orders and shards the samples itself (seeded, per replica): build it "
                            "without sampler=")
        if data.batch_size is None:
            raise DataError(f"{name}: the DataLoader has a batch_sampler of its own; the trainer batches the "
                            "samples itself: build it with batch_size= instead")
        return _nonempty(TorchSplit(data.dataset, name, data.collate_fn, data.num_workers, data.batch_size))
    if isinstance(data, IterableDataset):
        return _nonempty(StreamSplit(data, name))
    # A tuple is (inputs, targets); a list, like any other sequence, holds samples.
    if isinstance(data, TorchDataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")
                                          and not isinstance(data, (tuple, np.ndarray, torch.Tensor, Mapping))):
        return _nonempty(TorchSplit(data, name))
    if isinstance(data, tuple) and len(data) == 2:
        x = as_features(data[0], f"{name} inputs")
        y = (data[1] if isinstance(data[1], torch.Tensor)
             else torch.as_tensor(numeric(np.asarray(data[1]), name, "targets")))
        if len(x) != len(y):
            raise DataError(f"{name}: {len(x)} inputs but {len(y)} targets")
        if len(x) == 0:
            raise DataError(f"{name}: the split is empty")
        if y.is_floating_point() and not bool(torch.isfinite(y).all()):
            bad = int((~torch.isfinite(y)).sum())
            raise DataError(f"{name}: {bad} target value(s) are inf or NaN; clean or drop those samples before "
                            "training (a validation split's would make every val_ metric NaN)")
        return ArraySplit(x, y if y.is_floating_point() else y.long())
    raise DataError(f"{name}: cannot read {type(data).__name__} as data; give a torch Dataset, a DataLoader, "
                    "or an (inputs, targets) tuple of arrays")


def _nonempty(split: TorchSplit) -> TorchSplit:
    try:
        size = len(split)
    except (ValueError, TypeError, OverflowError) as exc:    # Python's len() refuses a negative or non-int size
        given = type(split.dataset).__name__
        raise DataError(f"{split.name}: {given}.__len__ does not give a sample count ({exc}); make it return "
                        "the number of samples, a whole number >= 0") from None
    if size == 0:
        raise DataError(f"{split.name}: the split is empty")
    return split


def own_dataset(data: Any) -> Any:
    """The user's own object under our wrappers and torch's (a split, a DataLoader, a Subset): where
    the attributes that state its task and classes live."""
    while isinstance(data, (TorchSplit, DataLoader, Subset)):
        data = data.dataset
    return data


def infer_task(data: Any, y: torch.Tensor) -> str:
    """The data's own task (a `task` attribute), else what its targets say."""
    stated = getattr(own_dataset(data), "task", None)
    if isinstance(stated, str):
        return stated
    if y.is_floating_point():
        return "regression"
    return "classification" if y.ndim == 1 else "language-model"


def class_count(data: Any, split, given: int | None, count: bool = True) -> int:
    """The number of classes: given, stated by the data (`num_classes`, torchvision's `classes`),
    or largest label + 1 (reading every target: said in the log), unless not `count` (0: unknown;
    the model is the user's own and scoring does not need it)."""
    data = own_dataset(data)
    if given:
        return given
    if isinstance(getattr(data, "num_classes", None), int):
        return data.num_classes
    if hasattr(data, "classes") and not callable(data.classes):
        return len(data.classes)
    if isinstance(split, ArraySplit):
        return infer_num_classes(split.y, split_name(data))
    if not count:
        return 0
    targets = getattr(data, "targets", None)
    if targets is None:
        print(f"scaletrain: counting the classes of {split.name} by reading its targets "
              "(give num_classes to skip this)", file=sys.stderr, flush=True)
        with kept_random_state():
            targets = [split_batch(sample, split.name)[1] for sample in split.samples()]
    return infer_num_classes(torch.as_tensor(np.asarray(targets)).long().view(-1), split.name)


def split_name(data: Any) -> str:
    return type(own_dataset(data)).__name__


def _random_parts(split: TorchSplit, fraction: float, seed: int) -> tuple[TorchSplit, TorchSplit]:
    """(rest, held out) of a map-style split, as hold_out_validation cuts an in-memory one."""
    rest, out = held_out(len(split), fraction, seed, split.name)
    part = lambda idx, suffix: TorchSplit(Subset(split.dataset, idx.tolist()), split.name + suffix,  # noqa: E731
                                          split.collate_fn, split.num_workers, split.batch_size)
    return part(rest, ""), part(out, " (validation)")


def as_dataset(train: Any, val: Any = None, test: Any = None, *, task: str = "auto", num_classes: int | None = None,
               val_fraction: float = 0.1, seed: int = 0, name: str | None = None,
               count_classes: bool = True) -> Dataset:
    """Our Dataset of the user's splits. Without `val`, a seeded `val_fraction` of `train` is held
    out for validation; without `test`, validation stands in for it (no separate test figure; it
    keeps the name val: `Dataset.test_held_out`).
    `count_classes`: read every target to count the classes where the data does not state them
    (a built-in model needs its output width; a user's own model does not)."""
    name = name or split_name(train)
    if train is None:
        raise DataError(f"{name}: the training split is None; give the samples (a torch Dataset or DataLoader, "
                        "(inputs, targets) arrays, a Hugging Face dataset)")
    splits = {key: as_split(value, f"{name} ({key})") if value is not None else None
              for key, value in (("train", train), ("val", val), ("test", test))}
    y = splits["train"].examples.y if isinstance(splits["train"], TorchSplit) else splits["train"].y
    # A user's own task (`package.module:Name`) scores whatever the targets are: the data's own
    # kind still decides how they are read (classes counted, labels checked).
    chosen = infer_task(train, y) if task == "auto" or ":" in task or targets_of(task).any_targets else task
    asks = targets_of(chosen)
    if asks.integer_labels and y.is_floating_point():
        raise DataError(f"{name}: {chosen} needs integer labels, the targets are {y.dtype}; "
                        "use task='regression' (--task regression)")
    classes = class_count(train, splits["train"], num_classes, count_classes) if asks.class_outputs else 1
    if asks.vocabulary and num_classes is None and hasattr(train, "vocab_size"):
        classes = int(train.vocab_size)
    in_memory = all(s is None or isinstance(s, ArraySplit) for s in splits.values())
    if in_memory:   # the device-resident path, normalised with the training split's statistics
        if asks.integer_labels:
            splits = {k: v if v is None else ArraySplit(v.x, as_labels(v.y, len(v), classes, f"{name} ({k})"))
                      for k, v in splits.items()}
        test_split = splits["test"] or splits["val"]
        ds = make_dataset(name, splits["train"], test_split if test_split is not None else splits["train"],
                          classes, val=splits["val"] if splits["test"] is not None else None, task=chosen)
        if splits["val"] is None:
            ds = hold_out_validation(ds, val_fraction, seed)
            if splits["test"] is None:
                ds.test, ds.val = ds.val, None
        ds.test_held_out = splits["test"] is not None
        return ds
    parts = {k: (v if isinstance(v, TorchSplit) or v is None else _array_as_torch(v, f"{name} ({k})"))
             for k, v in splits.items()}
    if parts["val"] is None:
        if isinstance(parts["train"], StreamSplit):
            raise DataError(f"{name}: a stream cannot be split at random for validation; give val= "
                            "(--data's function: a dict with 'val'), or a map-style Dataset")
        parts["train"], parts["val"] = _random_parts(parts["train"], val_fraction, seed)
    if parts["test"] is None:
        parts["test"], parts["val"] = parts["val"], None
    for part in parts.values():
        if part is not None and asks.integer_labels:
            part.label_bound = classes or None
    return Dataset(name=name, train=parts["train"], test=parts["test"], num_classes=classes, mean=None, std=None,
                   val=parts["val"], task=chosen, test_held_out=splits["test"] is not None)


def _array_as_torch(split: ArraySplit, name: str) -> TorchSplit:
    from torch.utils.data import TensorDataset
    return TorchSplit(TensorDataset(split.x, split.y), name)
