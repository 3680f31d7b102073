"""Reading shards: raw samples (bytes) in file order, verified as they are read, and decoding.

The shards are WebDataset tars (writer.py); WebDataset's own reader reads them too. We read them
with a minimal reader of the plain ustar members our writer produces: Python's `tarfile` stream
reader (which WebDataset uses) costs about 47 us per member, this one about 1.5 us (measured on
3 KB members, CPU, 2026-11-22), and a sample is two members. Anything else in a shard (pax or
GNU headers, links, folders) is refused: such a shard was not written by `scaletrain shard`.

Decoding comes after shuffling and skipping (stream.py), so a resumed epoch fast-forwards over
bytes, not over decoded samples. A shard is checked while it streams: its SHA-256 and sample count
must match the manifest when it ends, and a broken tar is one error naming the shard. A damaged
shard stops the run rather than being skipped: skipping would change one rank's step count and
hang the others at the next collective.
"""

from __future__ import annotations

import functools
import hashlib
import io
from collections.abc import Iterator

import numpy as np
import torch

from scaletrain.data.dataset import ArraySplit
from scaletrain.data.shards.manifest import Manifest, ShardFile
from scaletrain.data.shards.remote import open_remote
from scaletrain.errors import DataError
from scaletrain.tasks import targets_of

RawSample = tuple[bytes, bytes]   # (x.npy, y.npy)
BLOCK = 512
_REGULAR = (b"0", b"\0")


def _fail(manifest: Manifest, shard: ShardFile, problem: str) -> DataError:
    where = "serve the shards `scaletrain shard` wrote" if manifest.remote else "restore it"
    return DataError(f"shard {manifest.path(shard)} {problem}; {where} or rewrite the shards with `scaletrain shard`")


def _open(manifest: Manifest, shard: ShardFile):
    """(a binary file to read the shard from, its local cache entry if that is what it is)."""
    if manifest.remote:
        return open_remote(manifest.path(shard), shard.bytes, shard.sha256, manifest.fetch)
    return open(manifest.path(shard), "rb", buffering=1 << 20), None


def _members(file, digest) -> Iterator[tuple[str, bytes]]:
    """(name, content) of each member of a ustar stream, hashing every byte read. Raises
    ValueError for what our writer never produces or a stream that ends mid-member."""
    def read(n: int) -> bytes:
        data = file.read(n)
        digest.update(data)
        if len(data) < n:
            raise ValueError("it ends in the middle of a member (truncated)")
        return data
    while True:
        header = read(BLOCK)
        if header[0] == 0:   # the end-of-archive zero blocks
            return
        if header[257:262] != b"ustar" or header[156:157] not in _REGULAR:
            raise ValueError(f"member type {header[156:157]!r} / magic {header[257:263]!r} is not a plain ustar file")
        name = header[:100].split(b"\0", 1)[0].decode()
        size = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        body = read(-(-size // BLOCK) * BLOCK)
        yield name, body[:size]


def raw_samples(manifest: Manifest, shard: ShardFile) -> Iterator[RawSample]:
    """The shard's samples in file order, undecoded; raises DataError naming the shard when it is
    damaged. One sample is held back until the shard is verified, so a consumer that stops at
    the last sample has still had the whole shard checked."""
    count, held, digest = 0, None, hashlib.sha256()
    key, parts = None, {}
    x_header, y_header = _headers(manifest)
    file, cached = _open(manifest, shard)
    with file:
        try:
            for name, body in _members(file, digest):
                member_key, _, suffix = name.partition(".")
                if member_key != key:
                    key, parts = member_key, {}
                parts[suffix] = body
                if len(parts) == 2:
                    if "x.npy" not in parts or "y.npy" not in parts:
                        raise ValueError(f"sample {key} holds {sorted(parts)}, not x.npy and y.npy")
                    # Each array's header checked here, where the shard is known (the decoder checks
                    # it again, where only the folder is).
                    for part, header, shape, dtype in (("x.npy", x_header, manifest.sample_shape, manifest.x_dtype),
                                                       ("y.npy", y_header, manifest.y_shape, manifest.y_dtype)):
                        if parts[part][:len(header)] != header:
                            raise ValueError(f"sample {key}'s {part} is not a {dtype} array of shape {shape} as "
                                             "its manifest records")
                    count += 1
                    if held is not None:
                        yield held
                    held = parts["x.npy"], parts["y.npy"]
        except (ValueError, UnicodeDecodeError, IndexError) as exc:
            if cached is not None:
                cached.unlink(missing_ok=True)   # damaged on this disk: fetched again next time
            raise _fail(manifest, shard, f"cannot be read as a shard tar ({exc})") from None
        while block := file.read(1 << 20):   # the archive's trailing padding
            digest.update(block)
    if cached is not None and (count != shard.samples or digest.hexdigest() != shard.sha256):
        cached.unlink(missing_ok=True)   # damaged on this disk: the next run fetches it again
        raise DataError(f"the cached copy {cached} of shard {manifest.path(shard)} is damaged; it was dropped, "
                        "run again to fetch the shard anew")
    if count != shard.samples:
        raise _fail(manifest, shard, f"holds {count} samples where the manifest records {shard.samples}")
    if digest.hexdigest() != shard.sha256:
        raise _fail(manifest, shard, "does not match its SHA-256 checksum (corrupt)")
    if held is not None:
        yield held


def _headers(manifest: Manifest) -> tuple[bytes, bytes]:
    return (_npy_header(tuple(manifest.sample_shape), manifest.x_dtype),
            _npy_header(tuple(manifest.y_shape), manifest.y_dtype))


@functools.lru_cache(maxsize=16)
def _npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    """The .npy header `np.save` writes for one array of this shape and dtype."""
    array = np.zeros(shape, dtype=dtype)
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()[:len(buffer.getvalue()) - array.nbytes]


class BatchDecoder:
    """Decodes raw samples into one batch of tensors. Every array must carry exactly the .npy
    header of the manifest's shape and dtype (checked as a byte prefix); its data is then copied
    straight into the batch. Nothing is unpickled: an object array never has that header."""

    def __init__(self, manifest: Manifest):
        self.manifest = manifest
        self.x_header, self.y_header = _headers(manifest)
        # Class ids (or tokens) index the output layer: one past it is refused as read.
        self.class_targets = targets_of(manifest.task).class_outputs

    def _stack(self, arrays: list[bytes], header: bytes, shape: list[int], dtype: str) -> torch.Tensor:
        n = len(header)
        for raw in arrays:
            if raw[:n] != header:
                raise DataError(f"a sample in {self.manifest.folder} is not a {dtype} array of shape {shape} as "
                                "its manifest records; rewrite the shards with `scaletrain shard`")
        data = bytearray(b"".join(memoryview(raw)[n:] for raw in arrays))
        return torch.frombuffer(data, dtype=getattr(torch, dtype)).reshape(len(arrays), *shape) if data else \
            torch.empty((0, *shape), dtype=getattr(torch, dtype))

    def __call__(self, samples: list[RawSample]) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.manifest
        x = self._stack([s[0] for s in samples], self.x_header, m.sample_shape, m.x_dtype)
        y = self._stack([s[1] for s in samples], self.y_header, m.y_shape, m.y_dtype)
        if self.class_targets and y.numel() and (int(y.min()) < 0 or int(y.max()) >= m.num_classes):
            # A class id past the output layer would index out of range on the device (a CUDA
            # assert far from here); on the host, in the loader, it is one line naming the data.
            bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
            raise DataError(f"a sample in {m.folder} has the label {bad}, outside the manifest's {m.num_classes} "
                            "classes (num_classes); rewrite the shards with `scaletrain shard`")
        return x, y


def read_split(manifest: Manifest, split: str) -> ArraySplit:
    """A whole split in memory (evaluation splits: small beside the training split), in file order."""
    raws = [raw for shard in manifest.split(split) for raw in raw_samples(manifest, shard)]
    return ArraySplit(*BatchDecoder(manifest)(raws))
