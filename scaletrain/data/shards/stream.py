"""Which process reads which shard, in which order, and where a resumed epoch starts.

Rank r of R reads shards r, r+R, ... of the selection; its worker w of W reads every W-th of
those. Every epoch, each worker reads its shards in a seeded order through a seeded shuffle
buffer and yields whole batches (the samples that do not fill its last batch wait for the next
epoch's order, like drop_last). The DataLoader takes batches from its workers round-robin,
skipping exhausted ones, so the k-th batch of an epoch is a pure function of (seed, epoch, rank,
layout): a run resumed at step k tells each worker how many of its batches were already taken,
and the worker skips that many samples as undecoded bytes. A new iterator starts its round-robin
at its worker 0, so the DataLoader's worker i plays the part of worker (due + i) mod W, where
`due` is the worker whose batch would have come next.

Every rank runs `steps` batches an epoch: the fewest any rank can fill. Rank-and-worker layouts
with equal shard sizes lose nothing; uneven ones leave the largest ranks' last batches unread.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, islice

import torch
from torch.utils.data import IterableDataset, get_worker_info
from webdataset import shuffle

from scaletrain.data.shards.manifest import Manifest, ShardFile
from scaletrain.data.shards.reader import BatchDecoder, raw_samples
from scaletrain.errors import DataError


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """The shards of each (rank, worker) and how many batches each fills."""

    shards: tuple[ShardFile, ...]
    batch_size: int
    world_size: int
    workers: int          # reading processes per rank (1 when the DataLoader reads in-process)

    def __post_init__(self):
        if len(self.shards) < self.world_size:
            raise DataError(f"{len(self.shards)} training shard(s) cannot feed {self.world_size} ranks (each rank "
                            f"reads whole shards); write at least {self.world_size} with `scaletrain shard "
                            "--samples-per-shard` smaller, or select more shards")

    def worker_shards(self, rank: int, worker: int) -> tuple[ShardFile, ...]:
        return self.shards[rank::self.world_size][worker::self.workers]

    def worker_batches(self, rank: int) -> list[int]:
        return [sum(s.samples for s in self.worker_shards(rank, w)) // self.batch_size for w in range(self.workers)]

    @property
    def steps(self) -> int:
        """Batches per epoch, the same on every rank."""
        return min(sum(self.worker_batches(rank)) for rank in range(self.world_size))

    def resume_point(self, rank: int, batches: int) -> tuple[list[int], int]:
        """Once the rank has taken `batches` batches: how many each worker has delivered, and the
        worker due next. The DataLoader takes batches round-robin over the workers that still have
        some, starting at its worker 0 on every new iterator (its in-order rule)."""
        left, taken, due = self.worker_batches(rank), [0] * self.workers, 0
        if not 0 <= batches <= sum(left):
            raise ValueError(f"cannot resume at batch {batches} of {sum(left)}")
        for _ in range(batches):
            while taken[due] >= left[due]:
                due = (due + 1) % self.workers
            taken[due] += 1
            due = (due + 1) % self.workers
        return taken, due


class ShardStream(IterableDataset):
    """One rank's training batches for an epoch, decoded and collated in the worker processes."""

    # Benchmarks only (benchmarks/input_pipeline.py): busy seconds added to every sample's decoding,
    # a stand-in for JPEG decoding and the like. A class attribute, so forked workers inherit it.
    decode_cost_s: float = 0.0

    def __init__(self, manifest: Manifest, layout: ShardLayout, rank: int, seed: int, shuffle_buffer: int):
        self.manifest, self.layout, self.rank, self.seed = manifest, layout, rank, seed
        self.shuffle_buffer = shuffle_buffer
        self.epoch, self.skip, self.due = 0, [0] * layout.workers, 0

    def set_epoch(self, epoch: int, start_batch: int) -> None:
        """Read by the workers when an iterator starts them (they get a copy of this object)."""
        self.epoch = epoch
        self.skip, self.due = self.layout.resume_point(self.rank, start_batch)

    def _rng(self, worker: int, purpose: int) -> random.Random:
        return random.Random(((self.seed * 100_003 + self.epoch) * 1_009 + self.rank) * 101 + worker * 2 + purpose)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker = ((info.id if info is not None else 0) + self.due) % self.layout.workers
        shards = list(self.layout.worker_shards(self.rank, worker))
        self._rng(worker, 0).shuffle(shards)
        samples = chain.from_iterable(raw_samples(self.manifest, shard) for shard in shards)
        if self.shuffle_buffer > 1:
            buffer = shuffle(bufsize=self.shuffle_buffer, initial=self.shuffle_buffer, rng=self._rng(worker, 1))
            samples = buffer(samples)
        batch = self.layout.batch_size
        usable = self.layout.worker_batches(self.rank)[worker] * batch
        skipped = self.skip[worker] * batch
        samples = islice(samples, skipped, usable)   # skipped ones are never decoded
        decode = BatchDecoder(self.manifest)
        while chunk := list(islice(samples, batch)):
            if self.decode_cost_s:
                self._simulate_decoding(len(chunk))
            yield decode(chunk)

    def _simulate_decoding(self, samples: int) -> None:
        end = time.perf_counter() + self.decode_cost_s * samples
        while time.perf_counter() < end:   # busy, like a real decoder: holds a core
            pass
