"""Live tensor bytes, counted at the dispatcher: every storage an op creates is added when it
appears and removed when its last reference dies, in program order.

The same counter serves two purposes: on FakeTensors (nothing allocated) it predicts what a
forward/backward would hold, for models of any size (the memory planner); on real CPU tensors it
measures the peak where no allocator statistics exist (the batch-size finder's --memory-limit).
It counts tensor bytes, not allocator blocks: a CUDA caching allocator rounds each block up to
512 bytes and may fragment, which is why the planner adds a margin rather than trusting bytes.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class LiveBytes(TorchDispatchMode):
    """Counts storages created while active. Storages of `existing` tensors (parameters,
    buffers, inputs) are never counted, even when an op returns them (in-place updates).

    After the region: `peak` (bytes), and `timeline`, a list of (key, +bytes | -bytes) events
    from which `peak_excluding(keys)` replays the peak of everything but, say, the gradients."""

    def __init__(self, existing=()):
        super().__init__()
        self.seen = {storage_key(t) for t in existing}
        self.current = 0
        self.peak = 0
        # Events name storages by a serial number: a freed storage's address is soon reused.
        self.timeline: list[tuple[int, int]] = []
        self.live: dict[int, int] = {}   # address -> serial number of the storage living there
        self._refs: list[weakref.ref] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.seen:
            return
        self.seen.add(key)
        serial = len(self.timeline)
        self.live[key] = serial
        size = storage.nbytes()
        self._add(serial, size)
        self._refs.append(weakref.ref(storage, lambda _ref, key=key, serial=serial, size=size:
                                      self._free(key, serial, size)))

    def _free(self, key: int, serial: int, size: int) -> None:
        self._add(serial, -size)
        if self.live.get(key) == serial:
            del self.live[key]
            self.seen.discard(key)  # the address may be reused by a later storage

    def _add(self, serial: int, size: int) -> None:
        self.current += size
        self.peak = max(self.peak, self.current)
        self.timeline.append((serial, size))

    def peak_excluding(self, keys: set[int]) -> int:
        """The peak without the storages now living at `keys` (e.g. the gradients)."""
        skip = {self.live[k] for k in keys if k in self.live}
        current = peak = 0
        for serial, size in self.timeline:
            if serial not in skip:
                current += size
                peak = max(peak, current)
        return peak
