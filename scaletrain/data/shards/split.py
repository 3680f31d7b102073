"""`--data shards`: a data set whose training split stays on disk, in shards."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from braceexpand import braceexpand

from scaletrain.data.dataset import Dataset
from scaletrain.data.shards.manifest import Manifest, ShardFile
from scaletrain.data.shards.reader import read_split
from scaletrain.data.shards.remote import Fetch, is_url, name_of, parent
from scaletrain.errors import ConfigError, DataError


@dataclass(slots=True)
class ShardedSplit:
    """A training split streamed from shards: what the trainer's loader reads."""

    manifest: Manifest
    shards: tuple[ShardFile, ...]

    def __len__(self) -> int:
        return sum(s.samples for s in self.shards)


def _select(manifest: Manifest, names: list[str]) -> tuple[ShardFile, ...]:
    train = {s.name: s for s in manifest.split("train")}
    unknown = [n for n in names if n not in train]
    if unknown:
        raise DataError(f"{unknown[0]} is not a training shard of {manifest.file} "
                        f"(it lists {len(train)}: {min(train)} .. {max(train)}); fix the --data-dir pattern")
    return tuple(train[n] for n in dict.fromkeys(names))


def resolve(data_dir: str | None, fetch: Fetch | None = None) -> tuple[Manifest, tuple[ShardFile, ...]]:
    """The manifest and the training shards `data_dir` names: a shard folder (every training
    shard), or a brace pattern of training shards in one folder, e.g. 'DIR/train-{0000..0063}.tar';
    either may be a URL (remote.py)."""
    if not data_dir:
        raise ConfigError("--data shards needs --data-dir: a folder written by `scaletrain shard`, or a pattern "
                          "like 'DIR/train-{0000..0063}.tar'")
    if is_url(data_dir):
        if "{" not in data_dir:
            manifest = Manifest.read(data_dir, fetch)
            return manifest, tuple(manifest.split("train"))
        urls = list(braceexpand(data_dir))
        if len({parent(u) for u in urls}) != 1:
            raise ConfigError(f"--data-dir {data_dir}: the shards of one pattern must lie in one folder (the one "
                              "holding manifest.json)")
        manifest = Manifest.read(parent(urls[0]), fetch)
        return manifest, _select(manifest, [name_of(u) for u in urls])
    path = Path(data_dir)
    if path.is_dir():
        manifest = Manifest.read(path)
        return manifest, tuple(manifest.split("train"))
    files = [Path(p) for p in braceexpand(data_dir)]
    if len({f.parent for f in files}) != 1:
        raise ConfigError(f"--data-dir {data_dir}: the shards of one pattern must lie in one folder (the one "
                          "holding manifest.json)")
    if files == [path] and not path.exists():     # no pattern: a folder that is not there
        raise ConfigError(f"--data-dir {data_dir}: no such folder; pass the folder `scaletrain shard --out` wrote")
    if not files[0].parent.is_dir():
        raise ConfigError(f"--data-dir {data_dir}: the folder {files[0].parent} does not exist")
    manifest = Manifest.read(files[0].parent)
    return manifest, _select(manifest, [f.name for f in files])


def manifest_for(data_dir: str | None, fetch: Fetch | None = None) -> Manifest:
    return resolve(data_dir, fetch)[0]


def load_shards(data_dir: str | None, train_subset: int | None = None, fetch: Fetch | None = None) -> Dataset:
    """The training split stays in its shards; the evaluation splits are read into memory.
    `train_subset`: the fewest leading shards that hold at least that many samples (whole shards:
    a shard is read from its start)."""
    manifest, shards = resolve(data_dir, fetch)
    if train_subset:
        count = next((i + 1 for i in range(len(shards)) if sum(s.samples for s in shards[:i + 1]) >= train_subset),
                     len(shards))
        shards = shards[:count]
    if not manifest.split("test"):
        raise DataError(f"{manifest.file} lists no test shards; rewrite with `scaletrain shard`")
    manifest.check_files(shards + tuple(manifest.split("val")) + tuple(manifest.split("test")))
    mean, std = manifest.statistics()
    val = read_split(manifest, "val") if manifest.split("val") else None
    return Dataset(name=f"shards:{manifest.dataset}", train=ShardedSplit(manifest, shards),
                   test=read_split(manifest, "test"), num_classes=manifest.num_classes, mean=mean, std=std, val=val,
                   task=manifest.task)
