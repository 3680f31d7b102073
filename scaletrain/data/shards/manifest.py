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
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from scaletrain.config import TASKS
from scaletrain.data.shards.remote import Fetch, is_url, join, read_text
from scaletrain.errors import DataError

MANIFEST = "manifest.json"
FORMAT = "scaletrain-shards/1"
SPLITS = ("train", "val", "test")


# The dtypes a shard's arrays may have: plain numbers (an object array would need unpickling).
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
FIELDS = {"dataset", "task", "num_classes", "sample_shape", "x_dtype", "y_shape", "y_dtype", "stats_shape", "mean",
          "std", "shards"}
SHARD_FIELDS = {"name", "split", "samples", "bytes", "sha256"}


def _count(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _shape(value, empty_ok: bool) -> bool:
    return isinstance(value, list) and (empty_ok or len(value) > 0) and all(_count(d, 1) for d in value)


def schema_problem(body: dict) -> str | None:   # noqa: C901 - one check per field, in the file's order; flat
    """What is wrong with a manifest's fields (types, ranges, shard names inside the folder), or
    None: the one schema every manifest is read through, before any shard is opened."""
    unknown, missing = set(body) - FIELDS, FIELDS - {"stats_shape", "mean", "std"} - set(body)
    if unknown or missing:
        return f"unknown fields {sorted(unknown)}" if unknown else f"missing fields {sorted(missing)}"
    if not isinstance(body["dataset"], str):
        return "dataset must be a name"
    tasks = [t for t in TASKS if t != "auto"]      # the registered tasks (config.py's list)
    if body["task"] not in tasks:
        return f"task must be one of {', '.join(tasks)} (got {body['task']!r})"
    if not _count(body["num_classes"], 1):
        return f"num_classes must be a whole number of at least 1 (got {body['num_classes']!r})"
    for key, empty_ok in (("sample_shape", False), ("y_shape", True)):
        if not _shape(body[key], empty_ok):
            return f"{key} must be a list of sizes of at least 1 (got {body[key]!r})"
    for key in ("x_dtype", "y_dtype"):
        if body[key] not in DTYPES:
            return f"{key} must be one of {', '.join(DTYPES)} (got {body[key]!r})"
    stats = [body.get(k) for k in ("stats_shape", "mean", "std")]
    if any(v is not None for v in stats):
        shape, mean, std = stats
        if not _shape(shape, False):
            return f"stats_shape must be a list of sizes of at least 1 (got {shape!r})"
        size = math.prod(shape)
        for key, values in (("mean", mean), ("std", std)):
            if not (isinstance(values, list) and len(values) == size
                    and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                            for v in values)):
                return f"{key} must be {size} finite numbers (stats_shape {shape})"
        if any(v <= 0 for v in std):
            return "std must be positive"
    if not isinstance(body["shards"], list):
        return "shards must be a list"
    for shard in body["shards"]:
        if not isinstance(shard, dict) or set(shard) != SHARD_FIELDS:
            return f"a shard entry must have exactly the fields {sorted(SHARD_FIELDS)}"
        name = shard["name"]
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name or "\\" in name:
            return f"shard name {name!r} is not a file inside the folder"
        if shard["split"] not in SPLITS:
            return f"shard {name}: split must be one of {', '.join(SPLITS)} (got {shard['split']!r})"
        if not _count(shard["samples"], 0) or not _count(shard["bytes"], 0):
            return f"shard {name}: samples and bytes must be whole numbers of at least 0"
        if not (isinstance(shard["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", shard["sha256"])):
            return f"shard {name}: sha256 must be 64 hexadecimal digits"
    return None


@dataclass(frozen=True, slots=True)
class ShardFile:
    name: str        # file name inside the folder
    split: str
    samples: int
    bytes: int
    sha256: str


@dataclass(slots=True)
class Manifest:
    folder: Path | str           # a local folder, or a URL (remote.py)
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
    fetch: Fetch = field(default_factory=Fetch)   # how shards at a URL are fetched (not in the file)

    def split(self, name: str) -> list[ShardFile]:
        return [s for s in self.shards if s.split == name]

    @property
    def remote(self) -> bool:
        return is_url(self.folder)

    def path(self, shard: ShardFile) -> Path | str:
        return join(self.folder, shard.name) if self.remote else self.folder / shard.name

    @property
    def file(self) -> Path | str:
        """Where the manifest itself is."""
        return join(self.folder, MANIFEST) if self.remote else self.folder / MANIFEST

    def statistics(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.mean is None:
            return None, None
        shape = tuple(self.stats_shape)
        return (torch.tensor(self.mean, dtype=torch.float32).reshape(shape),
                torch.tensor(self.std, dtype=torch.float32).reshape(shape))

    def to_json(self) -> str:
        body = asdict(self)
        body.pop("folder")
        body.pop("fetch")
        return json.dumps({"format": FORMAT, **body}, indent=1)

    @classmethod
    def read(cls, folder: str | Path, fetch: Fetch | None = None) -> Manifest:
        """The manifest of a shard folder, local or at a URL (`fetch`: how to fetch from one)."""
        fetch = fetch or Fetch()
        if is_url(folder):
            folder = str(folder).rstrip("/")
            file = join(folder, MANIFEST)
            text = read_text(file, fetch, f"pass the URL of a folder `scaletrain shard` wrote (it holds {MANIFEST})")
        else:
            folder = Path(folder)
            file = folder / MANIFEST
            if not file.is_file():
                raise DataError(f"{folder} holds no {MANIFEST}; write shards with `scaletrain shard --data NAME --out "
                                f"{folder}` (a folder whose writing was cut off has none either)")
            text = None
        from scaletrain.files import parse_json
        from scaletrain.files import read_text as read_local
        suffix = "; rewrite the shards with `scaletrain shard`"
        try:
            body = parse_json(text if text is not None else read_local(file, error=DataError), str(file), dict,
                              DataError)
        except DataError as exc:
            raise DataError(f"{exc}{suffix}") from None
        try:
            if body.pop("format", None) != FORMAT:
                raise ValueError(f"not a {FORMAT} manifest")
            problem = schema_problem(body)
            if problem:
                raise ValueError(problem)
            shards = [ShardFile(**s) for s in body.pop("shards")]
            manifest = cls(folder=folder, shards=shards, fetch=fetch, **body)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise DataError(f"{file} is not a valid shard manifest ({exc}); rewrite the shards with "
                            "`scaletrain shard`") from None
        if not manifest.split("train"):
            raise DataError(f"{file} lists no training shards; rewrite the shards with `scaletrain shard`")
        return manifest

    def check_files(self, shards: list[ShardFile]) -> None:
        """Every shard is there and has its recorded size: a missing or truncated shard is named
        before any training starts (its checksum is verified as it is read). At a URL, each
        shard's size is checked when it is opened (remote.py): asking the server for every one
        first would cost a round trip per shard."""
        if self.remote:
            return
        for shard in shards:
            path = self.path(shard)
            if not path.is_file():
                raise DataError(f"shard {path} is missing; restore it or rewrite the shards with `scaletrain shard`")
            size = path.stat().st_size
            if size != shard.bytes:
                raise DataError(f"shard {path} has {size} bytes where the manifest records {shard.bytes} (truncated "
                                "or replaced); restore it or rewrite the shards with `scaletrain shard`")
