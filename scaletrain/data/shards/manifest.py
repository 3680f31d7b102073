"""A shard folder's manifest: which tar shards hold which split, how many samples each, their
sizes and SHA-256 checksums, the sample layout and the training split's statistics.

    <folder>/
        manifest.json          written last: a folder without one was never finished
        train-0000.tar ...     WebDataset shards: per sample `<key>.x.npy` and `<key>.y.npy`
        val-0000.tar ...       (NumPy files, read with allow_pickle=False: data never runs code)
        test-0000.tar ...
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from scaletrain.errors import DataError

MANIFEST = "manifest.json"
FORMAT = "scaletrain-shards/1"
SPLITS = ("train", "val", "test")


@dataclass(frozen=True, slots=True)
class ShardFile:
    name: str        # file name inside the folder
    split: str
    samples: int
    bytes: int
    sha256: str


@dataclass(slots=True)
class Manifest:
    folder: Path
    dataset: str
    task: str
    num_classes: int
    sample_shape: list[int]
    x_dtype: str
    y_shape: list[int]           # one target's shape: [] for a label, [T] for a token sequence
    y_dtype: str
    stats_shape: list[int] | None = None     # the normaliser's shape (C, 1, ...); None: token ids
    mean: list[float] | None = None
    std: list[float] | None = None
    shards: list[ShardFile] = field(default_factory=list)

    def split(self, name: str) -> list[ShardFile]:
        return [s for s in self.shards if s.split == name]

    def path(self, shard: ShardFile) -> Path:
        return self.folder / shard.name

    def statistics(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.mean is None:
            return None, None
        shape = tuple(self.stats_shape)
        return (torch.tensor(self.mean, dtype=torch.float32).reshape(shape),
                torch.tensor(self.std, dtype=torch.float32).reshape(shape))

    def to_json(self) -> str:
        body = asdict(self)
        body.pop("folder")
        return json.dumps({"format": FORMAT, **body}, indent=1)

    @classmethod
    def read(cls, folder: str | Path) -> "Manifest":
        folder = Path(folder)
        file = folder / MANIFEST
        if not file.is_file():
            raise DataError(f"{folder} holds no {MANIFEST}; write shards with `scaletrain shard --data NAME --out "
                            f"{folder}` (a folder whose writing was cut off has none either)")
        try:
            body = json.loads(file.read_text())
            if body.pop("format", None) != FORMAT:
                raise ValueError(f"not a {FORMAT} manifest")
            shards = [ShardFile(**s) for s in body.pop("shards")]
            manifest = cls(folder=folder, shards=shards, **body)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise DataError(f"{file} is not a readable shard manifest ({exc}); rewrite the shards with "
                            "`scaletrain shard`") from None
        if not manifest.split("train"):
            raise DataError(f"{file} lists no training shards; rewrite the shards with `scaletrain shard`")
        return manifest

    def check_files(self, shards: list[ShardFile]) -> None:
        """Every shard is there and has its recorded size: a missing or truncated shard is named
        before any training starts (its checksum is verified as it is read)."""
        for shard in shards:
            path = self.path(shard)
            if not path.is_file():
                raise DataError(f"shard {path} is missing; restore it or rewrite the shards with `scaletrain shard`")
            size = path.stat().st_size
            if size != shard.bytes:
                raise DataError(f"shard {path} has {size} bytes where the manifest records {shard.bytes} (truncated "
                                "or replaced); restore it or rewrite the shards with `scaletrain shard`")
