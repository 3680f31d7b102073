"""`--data shards`: a folder written by `scaletrain shard`, streamed from disk. The shards package
is imported only when used, because webdataset is an optional extra."""

from __future__ import annotations

from scaletrain.data.source import register_dataset
from scaletrain.errors import ConfigError
from scaletrain.tasks import targets_of


def shards_package():
    """scaletrain.data.shards, or a one-line error naming the extra to install."""
    try:
        import scaletrain.data.shards as shards
    except ModuleNotFoundError as exc:
        raise ConfigError(f"--data shards needs the '{exc.name}' package: pip install 'scaletrain[shards]'") from None
    return shards


def _fetch(cfg):
    from scaletrain.data.shards.remote import Fetch
    return Fetch(timeout_s=cfg.fetch_timeout_s, cache_mb=cfg.shard_cache_mb)


def _sample(cfg):
    manifest = shards_package().manifest_for(cfg.data_dir, _fetch(cfg))
    outputs = manifest.num_classes if targets_of(manifest.task).class_outputs else (manifest.y_shape or [1])[0]
    return tuple(manifest.sample_shape), outputs, manifest.task


@register_dataset("shards", sample=_sample, splits_itself=True)
def _shards(cfg, seed: int):
    return shards_package().load_shards(cfg.data_dir, cfg.train_subset, _fetch(cfg))
