"""The trainer's loader for a sharded training split: worker processes read and decode, batches
are pinned and copied to the device `prefetch` batches ahead on a side stream."""

from __future__ import annotations

from collections import deque

from torch.utils.data import DataLoader

from scaletrain.data.loaders import HostToDevice, own_generator
from scaletrain.data.shards.split import ShardedSplit
from scaletrain.data.shards.stream import ShardLayout, ShardStream


class ShardLoader(HostToDevice):
    def __init__(self, split: ShardedSplit, *args, num_workers: int = 0, prefetch: int = 2,
                 shuffle_buffer: int = 1000, **kwargs):
        super().__init__(split, *args, **kwargs)
        self.layout = ShardLayout(split.shards, self.batch_size, self.world_size, max(num_workers, 1))
        self.stream = ShardStream(split.manifest, self.layout, self.rank, self.seed,
                                  shuffle_buffer if self.shuffle else 0)
        self.loader = DataLoader(self.stream, batch_size=None, num_workers=num_workers, pin_memory=self.pin_memory,
                                 prefetch_factor=prefetch if num_workers else None, generator=own_generator())
        self.prefetch = prefetch

    def __len__(self) -> int:
        return self.layout.steps

    @property
    def num_samples(self) -> int:
        return len(self) * self.batch_size

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        super().set_epoch(epoch, start_batch)
        self.stream.set_epoch(epoch, start_batch)

    def __iter__(self):
        # Workers start here with a copy of the stream as it stands (this epoch, this start).
        batches = self._worker_batches()
        ahead: deque = deque()
        index, remaining = self.start_batch, len(self) - self.start_batch
        for _ in range(remaining):
            while len(ahead) < self.prefetch and (batch := next(batches, None)) is not None:
                ahead.append(self._to_device(batch))
            if not ahead:
                raise RuntimeError(f"the shard stream ended after {index} of {len(self)} batches")
            yield self._ready(*ahead.popleft(), index)
            index += 1
