"""Batches on the device: a device-resident path and a streaming path behind one iterator shape.

Both yield (x, y) already on the device, normalised with the training split's statistics and cast
to the precision policy's input dtype, with augmentation applied on the device. Shuffling is
seeded per epoch, identically on every rank; each rank takes its slice of every global batch
(`data/sharding.py`). Augmentation is reseeded per (epoch, batch, rank), so a run resumed at
any step draws exactly the augmentations the uninterrupted run would have.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, TensorDataset

from scaletrain.data.augment import DeviceAugment
from scaletrain.data.dataset import ArraySplit
from scaletrain.data.sharding import rank_positions
from scaletrain.data.user import SeededSamples, StreamBatches, StreamSplit, TorchSplit, collate_pairs
from scaletrain.errors import DataError, Terminated, UserError
from scaletrain.inputs import Inputs, map_inputs, tensors


@dataclass(slots=True)
class Normalizer:
    """Centres features with the training split's statistics and casts them to the precision's
    input dtype. Without statistics (token ids) the inputs pass through unchanged."""

    mean: torch.Tensor | None
    std: torch.Tensor | None
    dtype: torch.dtype

    def __call__(self, x: Inputs) -> Inputs:
        if isinstance(x, dict):   # several inputs (a user's dict samples): each as a single one
            return map_inputs(self, x)
        if self.mean is None:   # token ids pass as they are; a user's own features take the input dtype
            return x.to(self.dtype) if x.is_floating_point() and x.dtype != self.dtype else x
        out = (x.to(torch.float32) - self.mean) / self.std
        return out if out.dtype == self.dtype else out.to(self.dtype)

    def to(self, device) -> Normalizer:
        if self.mean is None:
            return self
        return Normalizer(self.mean.to(device), self.std.to(device), self.dtype)


class _BatchSource:
    """What both loaders share: batch counting, per-epoch seeding, sharding, normalise-then-augment.

    `batch_size` is this rank's batch; with `world_size` ranks a step consumes
    `batch_size * world_size` samples of the epoch's permutation.
    """

    def __init__(self, split: ArraySplit, batch_size: int, device: torch.device, normalizer: Normalizer,
                 shuffle: bool, drop_last: bool, augment: list[str] | tuple[str, ...] = (), shift: int = 0,
                 seed: int = 0, rank: int = 0, world_size: int = 1,
                 model_inputs: Callable[[Inputs, torch.Tensor], Inputs] | None = None):
        if world_size > 1 and not drop_last:
            raise ValueError("sharded loading needs drop_last (every rank takes equal slices)")
        self.split, self.batch_size, self.device = split, batch_size, device
        self.shuffle, self.drop_last, self.seed, self.epoch = shuffle, drop_last, seed, 0
        self.rank, self.world_size, self.start_batch = rank, world_size, 0
        self.normalizer = normalizer.to(device)
        # The order (the same on every rank) and the augmentations' draws come from generators on
        # the device where it has them (CPU, CUDA), else on the CPU, copied over (an XLA device:
        # an epoch's order once, a batch's offsets each; the same order as a CPU run's).
        draws = device if device.type in ("cpu", "cuda") else torch.device("cpu")
        self.generator = torch.Generator(device=draws).manual_seed(seed)
        self.augment_generator = torch.Generator(device=draws)
        self.augment = DeviceAugment(augment, shift, self.augment_generator) if augment else None
        # What the model is called with, from a finished batch (the task's: a model that computes
        # its own loss takes the targets among its inputs).
        self.model_inputs = model_inputs

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Next iteration yields epoch `epoch`'s batches from index `start_batch` on (for resume)."""
        self.epoch, self.start_batch = epoch, start_batch
        self.generator.manual_seed(self.seed * 100_003 + epoch)

    def stop_workers(self) -> None:
        """Ends this loader's worker processes at once (a stop: `workers_end_on_stop`). This one has none."""

    def dead_worker(self, exc: Exception) -> DataError | None:
        """`exc` as the one line naming a worker process of this loader that died. This one has none."""
        return None

    def __len__(self) -> int:
        n = len(self.split)
        global_batch = self.batch_size * self.world_size
        return n // global_batch if self.drop_last else -(-n // self.batch_size)

    @property
    def num_samples(self) -> int:
        return len(self) * self.batch_size if self.drop_last else len(self.split)

    def _order(self, generator: torch.Generator, device) -> torch.Tensor:
        """This rank's sample indices for the epoch, from `start_batch` on, batch after batch."""
        n = len(self.split)
        order = (torch.randperm(n, device=generator.device, generator=generator).to(device) if self.shuffle
                 else torch.arange(n, device=device))
        if self.world_size > 1:
            order = order[rank_positions(len(self), self.batch_size, self.rank, self.world_size).to(device)]
        elif self.drop_last:
            order = order[:len(self) * self.batch_size]
        return order[self.start_batch * self.batch_size:]

    def _finish(self, x: torch.Tensor, y: torch.Tensor, batch_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.normalizer(x)
        if self.augment is not None:
            self.augment_generator.manual_seed(
                ((self.seed * 100_003 + self.epoch) * 1_000_003 + batch_index) * 1_009 + self.rank)
            x = self.augment(x)
        if self.model_inputs is not None:
            x = self.model_inputs(x, y)
        return x, y


class DeviceLoader(_BatchSource):
    """The whole split lives on the device; an epoch is a device permutation and gathers."""

    def __init__(self, split: ArraySplit, *args, **kwargs):
        super().__init__(split, *args, **kwargs)
        self.x = split.x.to(self.device)
        self.y = split.y.to(self.device)

    def __iter__(self):
        order = self._order(self.generator, self.device)
        for i in range(len(self) - self.start_batch):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield self._finish(self.x[idx], self.y[idx], self.start_batch + i)


class _Positions(torch.utils.data.Sampler):
    """Hands the DataLoader the loader's current index order.

    It holds its loader weakly: a strong reference closes a cycle (loader -> DataLoader -> sampler
    -> loader), which only the cycle collector frees, and it calls multiprocessing's queue
    finalizers before the DataLoader's own, so the workers never receive their stop and each
    costs a 5 s join timeout: a `--num-workers 2` run spent 30 s at exit, a second fit() in one
    process 30 s in whatever it was doing when the collector ran."""

    def __init__(self, source: StreamingLoader, with_epoch: bool = False):
        self._source = weakref.ref(source)
        self.with_epoch = with_epoch   # (epoch, index) keys, for SeededSamples

    @property
    def source(self) -> StreamingLoader:
        return self._source()

    def __iter__(self):
        order = self.source._order(self.source.host_generator, "cpu").tolist()
        if self.with_epoch:
            epoch = self.source.epoch
            return iter([(epoch, i) for i in order])
        return iter(order)

    def __len__(self) -> int:
        return (len(self.source) - self.source.start_batch) * self.source.batch_size


def own_generator() -> torch.Generator:
    """For a DataLoader: every new iterator draws its workers' base seed from the loader's
    generator, by default the global one, which would shift the model's dropout masks by one
    draw per epoch and make a resumed run (one draw fewer) differ from an uninterrupted one."""
    return torch.Generator().manual_seed(0)


class HostToDevice(_BatchSource):
    """Batches read on the host (pinned when the device is a GPU), copied with non-blocking
    transfers on a side stream, so the copy of the next batch overlaps the compute of this one."""

    def __init__(self, split, *args, **kwargs):
        super().__init__(split, *args, **kwargs)
        self.pin_memory = self.device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(self.device) if self.pin_memory else None
        self._reading: Iterator | None = None   # the DataLoader's iterator, once iterated: its workers

    def _worker_batches(self) -> Iterator:
        """The DataLoader's batches (`self.loader`), through `from_workers`, its iterator kept so that
        a stop landing outside a read can still end its workers (`stop_workers`)."""
        self._reading = iter(self.loader)
        return from_workers(self._reading)

    def stop_workers(self) -> None:
        if self._reading is not None:
            stop_workers(self._reading)

    def dead_worker(self, exc: Exception) -> DataError | None:
        if self._reading is None:
            return None
        return dead_worker_error(self._reading, getattr(self.split, "name", "the data"), self._batch_samples, exc)

    def _batch_samples(self, batch: int) -> list[int]:
        """The positions of this epoch's `batch`-th batch read (the order drawn again as set_epoch seeds it)."""
        order = self._order(torch.Generator().manual_seed(self.seed * 100_003 + self.epoch), "cpu").tolist()
        return order[batch * self.batch_size:(batch + 1) * self.batch_size]

    def _to_device(self, batch):
        x, y = batch
        if self.copy_stream is None:
            return map_inputs(lambda t: t.to(self.device), x), y.to(self.device)
        with torch.cuda.stream(self.copy_stream):
            return (map_inputs(lambda t: t.to(self.device, non_blocking=True), x),
                    y.to(self.device, non_blocking=True))

    def _ready(self, x, y, batch_index: int):
        if self.copy_stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.copy_stream)
            for t in (*tensors(x), y):
                t.record_stream(current)
        return self._finish(x, y, batch_index)


class StreamingLoader(HostToDevice):
    """A split through a DataLoader on the host, copied to the device one batch ahead: an in-memory
    split, or a user's torch Dataset (a TorchSplit, data/user.py) with its own collate function, in
    the order and share the loader sets (`_Positions`), or a user's stream (a StreamSplit) in its
    own order, this replica's share of it (`StreamBatches`)."""

    def __init__(self, split: ArraySplit | TorchSplit, *args, num_workers: int = 0, **kwargs):
        super().__init__(split, *args, **kwargs)
        self.host_generator = torch.Generator()
        self.stream = StreamBatches(split, self.seed) if isinstance(split, StreamSplit) else None
        if self.stream is not None:
            # Read in the stream's own order, a whole batch per item; workers start afresh each
            # epoch, so they see its epoch and batches (`_stream_batches`).
            self.shuffle = False
            self.loader = DataLoader(self.stream, batch_size=None, num_workers=num_workers,
                                     collate_fn=collate_pairs(split.collate_fn, split.label_bound),
                                     pin_memory=self.pin_memory, generator=own_generator())
            return
        if isinstance(split, TorchSplit):
            dataset = SeededSamples(split.dataset, self.seed)
            collate = collate_pairs(split.collate_fn, split.label_bound)
        else:
            dataset, collate = TensorDataset(split.x, split.y), None
        self.loader = DataLoader(dataset, batch_size=self.batch_size, collate_fn=collate,
                                 sampler=_Positions(self, with_epoch=isinstance(split, TorchSplit)),
                                 drop_last=False, num_workers=num_workers,
                                 pin_memory=self.pin_memory, persistent_workers=num_workers > 0,
                                 generator=own_generator())

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        super().set_epoch(epoch, start_batch)
        self.host_generator.manual_seed(self.seed * 100_003 + epoch)

    def _stream_batches(self) -> list[tuple[int, int]]:
        """This process's batches of the stream as (first, end) positions: the same slices of the
        same global batches the map-style path takes, in the stream's order (batches of one replica
        are contiguous ranges: data/sharding.py)."""
        order = self._order(self.host_generator, "cpu")
        return [(int(order[i]), int(order[min(i + self.batch_size, len(order)) - 1]) + 1)
                for i in range(0, len(order), self.batch_size)]

    def __iter__(self):
        if self.stream is not None:
            self.stream.epoch, self.stream.batches = self.epoch, self._stream_batches()
        batches = self._worker_batches()
        first = next(batches, None)
        if first is None:
            return
        index = self.start_batch
        ahead = self._to_device(first)
        for batch in batches:
            current, ahead = ahead, self._to_device(batch)
            yield self._ready(*current, index)
            index += 1
        yield self._ready(*ahead, index)


def from_workers(batches: Iterator) -> Iterator:
    """A DataLoader's batches, with a user error met in one of its worker processes (a damaged
    shard, a user's __getitem__) raised as itself: torch re-raises it wrapped in its worker's
    traceback ("Caught DataError in DataLoader worker process 1. Original Traceback ..."), which
    would reach the user as a traceback instead of the one line."""
    try:
        yield from batches
    except UserError as exc:
        raise type(exc)(original_message(exc)) from None
    except (KeyboardInterrupt, Terminated, SystemExit):
        stop_workers(batches)
        raise


@contextlib.contextmanager
def workers_end_on_stop(*loaders: _BatchSource):
    """A stop (SIGTERM, Ctrl-C) raised anywhere inside (a step, an evaluation, a callback) ends
    the loaders' worker processes before it goes on. One raised inside a loader's read is met there
    (`from_workers`); one raised in a step left the read suspended, and the workers, hung in a
    user's read, were joined 5 s each by the DataLoader's shutdown once it was collected (10 s a
    rank, seen stopping a job mid-step), or, in a launched worker that leaves through os._exit, never."""
    try:
        yield
    except (KeyboardInterrupt, Terminated):
        for loader in loaders:
            loader.stop_workers()
        raise
    except (RuntimeError, OSError, EOFError) as exc:
        # A worker that died: torch's "DataLoader worker (pid(s) ...) exited unexpectedly", or the
        # connection it was handing a batch over on, reset.
        error = next(filter(None, (loader.dead_worker(exc) for loader in loaders)), None)
        if error is None:
            raise
        for loader in loaders:
            loader.stop_workers()
        raise error from None


def unwatch_workers(batches: Iterator) -> None:
    """Takes the DataLoader iterator's workers out of torch's SIGCHLD watch (its private worker pid
    registry), whose handler raises at whatever line runs when one of them ends."""
    if getattr(batches, "_worker_pids_set", False):
        from torch.utils.data._utils.signal_handling import _remove_worker_pids
        _remove_worker_pids(id(batches))
        batches._worker_pids_set = False


def stop_workers(batches: Iterator) -> None:
    """A stop (SIGTERM, Ctrl-C) ends the loader's worker processes at once. The DataLoader's own
    shutdown asks each worker to finish and joins it for up to 5 s before terminating it: a worker
    hung in a user's read (a network call that never returns) cost 5 s each, 10.7 s for two, and the
    run's end waited for it (issue 66). Its workers are killed here, then the DataLoader shuts down
    what is left (queues, the pin thread) as it would; it uses torch's private `_workers` and worker
    pid registry, so a DataLoader without them is left to its own shutdown."""
    unwatch_workers(batches)   # first: torch's SIGCHLD handler would raise "worker killed by signal" over the stop
    for worker in getattr(batches, "_workers", ()):
        if worker.is_alive():
            worker.kill()
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def dead_worker_error(reading, name: str, samples_of: Callable[[int], list[int]],
                      error: Exception) -> DataError | None:
    """A DataLoader whose worker process died (killed, out of memory, os._exit, a crash in C code),
    met as `error`: which worker, how it ended, and the samples it was reading (its batches in flight, by the
    positions `samples_of(batch)` gives), in one line. torch's own words are two tracebacks of its
    internals. Reads the iterator's private `_workers` and `_task_info`; None where they are not there."""
    import signal as signals
    import time
    workers = getattr(reading, "_workers", None) or ()
    unwatch_workers(reading)   # first: torch's SIGCHLD handler would raise its own words at any line from here
    # A reset connection can come before the dying worker's exit: give it a moment to have one.
    deadline = time.monotonic() + (2.0 if isinstance(error, OSError) else 0.0)
    while not (dead := [(i, w) for i, w in enumerate(workers) if w.exitcode is not None]) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    if not dead:
        return None
    i, worker = dead[0]
    code = worker.exitcode
    if code in (-signals.SIGTERM, -signals.SIGINT):
        return None    # a stop sent to the process group (Ctrl-C, a scheduler, the launcher): this process's own
    how = (f"was killed by {signals.Signals(-code).name}" if code < 0 and -code in signals.valid_signals()
           else f"exited with code {code}")
    batches = sorted(k for k, info in getattr(reading, "_task_info", {}).items() if len(info) == 1 and info[0] == i)
    try:
        samples = sorted(s for k in batches for s in samples_of(k))
    except Exception:   # noqa: BLE001 - the range is a help; the line stands without it
        samples = []
    shown = ", ".join(map(str, samples[:4])) + (f", ..., {samples[-1]}" if len(samples) > 4 else "")
    held = f" while reading {len(batches)} batch(es): samples {shown}" if samples else ""
    return DataError(f"{name}: DataLoader worker {i} (pid {worker.pid}) {how}{held}; a worker process ends so when "
                     "it is killed, runs out of memory or crashes in C code: read those samples with "
                     "num_workers=0 to see the failure in this process")


def original_message(exc: BaseException) -> str:
    text = str(exc)
    if not (text.startswith("Caught ") and "Original Traceback" in text):
        return text
    prefix = f"{type(exc).__module__}.{type(exc).__qualname__}: "
    lines = [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]
    return lines[-1] if lines else text
