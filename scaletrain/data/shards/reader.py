"""Reading shards: raw samples (bytes) in file order, verified as they are read, and decoding.

Decoding comes after shuffling and skipping (stream.py), so a resumed epoch fast-forwards over
bytes, not over decoded samples. A shard is checked while it streams: its SHA-256 and sample count
must match the manifest when it ends, and a broken tar is one error naming the shard. A damaged
shard stops the run rather than being skipped: skipping would change one rank's step count and
hang the others at the next collective.
"""

from __future__ import annotations

import hashlib
import io
from typing import Iterator

import numpy as np
import torch
from webdataset.tariterators import group_by_keys, tar_file_iterator

from scaletrain.data.dataset import ArraySplit
from scaletrain.data.shards.manifest import Manifest, ShardFile
from scaletrain.errors import DataError

RawSample = tuple[bytes, bytes]   # (x.npy, y.npy)


class _HashingReader(io.RawIOBase):
    """A file read through once, hashing every byte that passes."""

    def __init__(self, file):
        self.file, self.digest = file, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.file.readinto(buffer)
        self.digest.update(memoryview(buffer)[:n])
        return n

    def drain(self) -> str:
        """Reads what the tar reader left (end-of-archive padding) and returns the checksum."""
        while self.file.read(1 << 20):
            pass
        return self.digest.hexdigest()


def _fail(manifest: Manifest, shard: ShardFile, problem: str) -> DataError:
    return DataError(f"shard {manifest.path(shard)} {problem}; restore it or rewrite the shards with `scaletrain shard`")


def raw_samples(manifest: Manifest, shard: ShardFile) -> Iterator[RawSample]:
    """The shard's samples in file order, undecoded; raises DataError naming the shard when it is
    damaged. One sample is held back until the shard is verified, so a consumer that stops at
    the last sample has still had the whole shard checked."""
    count, held = 0, None
    with open(manifest.path(shard), "rb", buffering=0) as file:
        reader = _HashingReader(file)
        stream = io.BufferedReader(reader, buffer_size=1 << 20)
        try:
            files = ({**entry, "__url__": file.name} for entry in tar_file_iterator(stream))
            for sample in group_by_keys(files):
                if "x.npy" not in sample or "y.npy" not in sample:
                    raise _fail(manifest, shard, f"holds a sample without x.npy and y.npy ({sample.get('__key__')})")
                count += 1
                if held is not None:
                    yield held
                held = sample["x.npy"], sample["y.npy"]
        except DataError:
            raise
        except Exception as exc:   # tarfile.ReadError, EOFError, ...: a broken archive
            raise _fail(manifest, shard, f"cannot be read as a tar archive ({exc})") from None
        checksum = reader.drain()
    if count != shard.samples:
        raise _fail(manifest, shard, f"holds {count} samples where the manifest records {shard.samples}")
    if checksum != shard.sha256:
        raise _fail(manifest, shard, "does not match its SHA-256 checksum (corrupt)")
    if held is not None:
        yield held


def decode(raw: RawSample, manifest: Manifest) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        x, y = np.load(io.BytesIO(raw[0]), allow_pickle=False), np.load(io.BytesIO(raw[1]), allow_pickle=False)
    except ValueError as exc:
        raise DataError(f"a sample in {manifest.folder} is not a plain NumPy array ({exc}); rewrite the shards "
                        "with `scaletrain shard`") from None
    if list(x.shape) != manifest.sample_shape or list(y.shape) != manifest.y_shape:
        raise DataError(f"a sample in {manifest.folder} has shape {list(x.shape)} / target {list(y.shape)} where the "
                        f"manifest records {manifest.sample_shape} / {manifest.y_shape}; rewrite the shards")
    return torch.from_numpy(x), torch.from_numpy(y)


def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples])


def read_split(manifest: Manifest, split: str) -> ArraySplit:
    """A whole split in memory (evaluation splits: small beside the training split), in file order."""
    samples = [decode(raw, manifest) for shard in manifest.split(split) for raw in raw_samples(manifest, shard)]
    if not samples:
        x = torch.empty((0, *manifest.sample_shape), dtype=getattr(torch, manifest.x_dtype))
        return ArraySplit(x, torch.empty((0, *manifest.y_shape), dtype=getattr(torch, manifest.y_dtype)))
    return ArraySplit(*collate(samples))
