"""Which loader reads a split, and where its arrays sit: a user's torch Dataset streams through
its own collate and workers (loaders.py's StreamingLoader), shards stream from disk (shards/),
arrays go to the device or stream from the host. Above both loaders and shards, so neither
imports the other's chooser."""

from __future__ import annotations

import torch

from scaletrain.config import DataConfig
from scaletrain.data.dataset import ArraySplit
from scaletrain.data.loaders import DeviceLoader, StreamingLoader
from scaletrain.data.user import TorchSplit


def choose_placement(requested: str, split_bytes: int, device: torch.device) -> str:
    """'auto' keeps the data on the device when it takes under half of the free device memory."""
    if requested != "auto":
        return requested
    if device.type != "cuda":
        return "device"
    free, _ = torch.cuda.mem_get_info(device)
    return "device" if split_bytes < free // 2 else "stream"


def loader_class(split, data: DataConfig, device: torch.device) -> tuple[type, dict]:
    """Which loader reads `split`, and the options of its kind: a user's torch Dataset streams
    through its own collate and workers in our order; shards stream from disk, never whole in
    memory; arrays sit on the device where `data.placement` puts them there (choose_placement)."""
    if isinstance(split, TorchSplit):
        workers = split.num_workers if split.num_workers is not None else data.num_workers
        return StreamingLoader, {"num_workers": workers}
    if not isinstance(split, ArraySplit):   # a ShardedSplit
        from scaletrain.data.shards import ShardLoader  # webdataset is an optional extra
        return ShardLoader, dict(num_workers=data.num_workers, prefetch=data.prefetch,
                                 shuffle_buffer=data.shuffle_buffer)
    if choose_placement(data.placement, split.x.nbytes + split.y.nbytes, device) == "device":
        return DeviceLoader, {}
    return StreamingLoader, {"num_workers": data.num_workers}
