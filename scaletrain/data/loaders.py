"""Batches on the device: a device-resident path and a streaming path behind one iterator shape.

Both yield (x, y) already on the device, normalised with the training split's statistics and cast
to the precision policy's input dtype, with augmentation applied on the device. Shuffling is
seeded per epoch (seed + epoch), so a run is reproducible and a later data-parallel shard can
derive its order from the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, TensorDataset

from scaletrain.data.augment import DeviceAugment
from scaletrain.data.dataset import ArraySplit


@dataclass(slots=True)
class Normalizer:
    mean: torch.Tensor
    std: torch.Tensor
    dtype: torch.dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return ((x.to(torch.float32) - self.mean) / self.std).to(self.dtype)


class _BatchSource:
    """What both loaders share: batch counting, per-epoch seeding, normalise-then-augment."""

    def __init__(self, split: ArraySplit, batch_size: int, device: torch.device, normalizer: Normalizer,
                 shuffle: bool, drop_last: bool, augment: list[str] | tuple[str, ...] = (), shift: int = 0,
                 seed: int = 0):
        self.split, self.batch_size, self.device = split, batch_size, device
        self.shuffle, self.drop_last, self.seed, self.epoch = shuffle, drop_last, seed, 0
        self.normalizer = Normalizer(normalizer.mean.to(device), normalizer.std.to(device), normalizer.dtype)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.augment = DeviceAugment(augment, shift, self.generator) if augment else None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.generator.manual_seed(self.seed * 100_003 + epoch)

    def __len__(self) -> int:
        n = len(self.split)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def num_samples(self) -> int:
        return len(self) * self.batch_size if self.drop_last else len(self.split)

    def _finish(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.normalizer(x)
        if self.augment is not None:
            x = self.augment(x)
        return x, y


class DeviceLoader(_BatchSource):
    """The whole split lives on the device; an epoch is a device permutation and gathers."""

    def __init__(self, split: ArraySplit, *args, **kwargs):
        super().__init__(split, *args, **kwargs)
        self.x = split.x.to(self.device)
        self.y = split.y.to(self.device)

    def __iter__(self):
        n = len(self.y)
        order = (torch.randperm(n, device=self.device, generator=self.generator) if self.shuffle
                 else torch.arange(n, device=self.device))
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield self._finish(self.x[idx], self.y[idx])


class StreamingLoader(_BatchSource):
    """A DataLoader on the host (pinned memory), copied with non-blocking transfers one batch
    ahead on a side stream, so the copy of batch i+1 overlaps the compute of batch i."""

    def __init__(self, split: ArraySplit, *args, num_workers: int = 0, **kwargs):
        super().__init__(split, *args, **kwargs)
        cuda = self.device.type == "cuda"
        self.host_generator = torch.Generator()
        self.loader = DataLoader(TensorDataset(split.x, split.y), batch_size=self.batch_size,
                                 shuffle=self.shuffle, drop_last=self.drop_last, num_workers=num_workers,
                                 pin_memory=cuda, generator=self.host_generator,
                                 persistent_workers=num_workers > 0)
        self.copy_stream = torch.cuda.Stream(self.device) if cuda else None

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.host_generator.manual_seed(self.seed * 100_003 + epoch)

    def _to_device(self, batch):
        x, y = batch
        if self.copy_stream is None:
            return x.to(self.device), y.to(self.device)
        with torch.cuda.stream(self.copy_stream):
            return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def _ready(self, x, y):
        if self.copy_stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.copy_stream)
            x.record_stream(current)
            y.record_stream(current)
        return self._finish(x, y)

    def __iter__(self):
        batches = iter(self.loader)
        first = next(batches, None)
        if first is None:
            return
        ahead = self._to_device(first)
        for batch in batches:
            current, ahead = ahead, self._to_device(batch)
            yield self._ready(*current)
        yield self._ready(*ahead)


def choose_placement(requested: str, split_bytes: int, device: torch.device) -> str:
    """'auto' keeps the data on the device when it takes under half of the free device memory."""
    if requested != "auto":
        return requested
    if device.type != "cuda":
        return "device"
    free, _ = torch.cuda.mem_get_info(device)
    return "device" if split_bytes < free // 2 else "stream"
