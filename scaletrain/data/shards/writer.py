"""Writing any loaded data set, a user's own torch Dataset too, into WebDataset tar shards with a
manifest (`scaletrain shard`)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from webdataset import TarWriter

from scaletrain.checkpoint.store import write_atomically
from scaletrain.data.dataset import ArraySplit, Dataset
from scaletrain.data.shards.manifest import MANIFEST, Manifest, ShardFile


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _write_shard(path: Path, rows: ArraySplit, first_key: int) -> None:
    x, y = rows.x.numpy(), rows.y.numpy()
    tmp = path.with_name("." + path.name + ".tmp")
    with open(tmp, "wb") as file:
        # Plain ustar members (no pax headers: reader.py reads exactly these) with a fixed integer
        # mtime, so the same data writes byte-identical shards (and checksums).
        with TarWriter(file, encoder=False, mtime=0, format=tarfile.USTAR_FORMAT) as writer:
            for i in range(len(x)):
                writer.write({"__key__": f"{first_key + i:09d}", "x.npy": _npy(x[i]), "y.npy": _npy(y[i])})
        file.flush()
        os.fsync(file.fileno())
    tmp.replace(path)


def write_shards(dataset: Dataset, folder: Path, samples_per_shard: int,
                 publish: Callable[[Path], None] | None = None) -> Manifest:
    """Writes the train, val and test splits as shards of at most `samples_per_shard` samples each
    (a split's shards differ by at most one sample), then the manifest: a folder is usable only
    once its manifest is there. `publish`, where given, takes each finished file away (remote.py's
    `destination`: an upload), the manifest last."""
    folder.mkdir(parents=True, exist_ok=True)
    mean, std = dataset.mean, dataset.std
    manifest = Manifest(
        folder=folder, dataset=dataset.name, task=dataset.task, num_classes=dataset.num_classes,
        sample_shape=list(dataset.input_shape), x_dtype=str(dataset.examples.x.dtype).removeprefix("torch."),
        y_shape=list(dataset.examples.y.shape[1:]), y_dtype=str(dataset.examples.y.dtype).removeprefix("torch."),
        stats_shape=list(mean.shape) if mean is not None else None,
        mean=mean.flatten().tolist() if mean is not None else None,
        std=std.flatten().tolist() if std is not None else None)
    key = 0
    for name, split in (("train", dataset.train), ("val", dataset.val), ("test", dataset.test)):
        if split is None or len(split) == 0:
            continue
        count = -(-len(split) // samples_per_shard)
        bounds = np.linspace(0, len(split), count + 1).round().astype(int)   # balanced sizes
        # Shard after shard, one in memory at a time: sliced from memory, or read from a user's
        # torch Dataset or stream (data/user.py) in one pass, so a set larger than memory is written too.
        for i, rows in enumerate(split.pieces(bounds.tolist())):
            path = folder / f"{name}-{i:04d}.tar"
            _write_shard(path, rows, key)
            key += len(rows)
            manifest.shards.append(ShardFile(path.name, name, int(bounds[i + 1] - bounds[i]), path.stat().st_size,
                                             _sha256(path)))
            if publish is not None:
                publish(path)
    write_atomically(folder / MANIFEST, manifest.to_json())
    if publish is not None:
        publish(folder / MANIFEST)
    return manifest
