"""Data bigger than memory: WebDataset tar shards with a manifest, written by `scaletrain shard`
and streamed by worker processes (`--data shards`)."""

from scaletrain.data.shards.loader import ShardLoader
from scaletrain.data.shards.manifest import Manifest, ShardFile
from scaletrain.data.shards.split import ShardedSplit, load_shards, manifest_for
from scaletrain.data.shards.writer import write_shards

__all__ = ["Manifest", "ShardFile", "ShardLoader", "ShardedSplit", "load_shards", "manifest_for", "write_shards"]
