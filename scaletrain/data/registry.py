"""Data sets by name."""

from __future__ import annotations

from scaletrain.data.cifar import load_cifar10
from scaletrain.data.dataset import ArraySplit, Dataset, hold_out_validation, make_dataset
from scaletrain.data.generated import load_digits, load_friedman1, load_mnist1d, load_synthetic
from scaletrain.data.idx import load_idx_dataset
from scaletrain.data.npz import load_npz
from scaletrain.data.text import load_char_corpus, pydoc_text
from scaletrain.errors import ConfigError

DATASETS = ("mnist1d", "digits", "synthetic", "mnist", "fashion-mnist", "cifar10", "npz", "friedman1", "char-corpus",
            "shards")
# Sample shape and class count of the named data sets, for planning without loading any data.
SAMPLE_SHAPES = {"mnist1d": ((1, 40), 10), "digits": ((1, 8, 8), 10), "mnist": ((1, 28, 28), 10),
                 "fashion-mnist": ((1, 28, 28), 10), "cifar10": ((3, 32, 32), 10)}


def _shards():
    """The shards package, imported when used: webdataset is an optional extra."""
    try:
        import scaletrain.data.shards as shards
    except ModuleNotFoundError as exc:
        raise ConfigError(f"--data shards needs the '{exc.name}' package: pip install 'scaletrain[shards]'") from None
    return shards


def shard_manifest(data_dir: str | None):
    """The manifest a shard folder or pattern names."""
    return _shards().manifest_for(data_dir)


def sample_shape(cfg) -> tuple[tuple[int, ...], int, str]:
    """(sample shape, model output size, task) of the data set a DataConfig names, without loading
    it where known."""
    if cfg.name == "synthetic":
        return tuple(cfg.shape), cfg.num_classes, "classification"
    if cfg.name == "char-corpus":
        return (cfg.seq_len,), len(set(pydoc_text())), "language-model"
    if cfg.name == "friedman1":
        return (10,), 1, "regression"
    if cfg.name in SAMPLE_SHAPES:
        return (*SAMPLE_SHAPES[cfg.name], "classification")
    if cfg.name == "shards":
        manifest = shard_manifest(cfg.data_dir)
        outputs = manifest.num_classes if manifest.task != "regression" else (manifest.y_shape or [1])[0]
        return tuple(manifest.sample_shape), outputs, manifest.task
    ds = load_dataset(cfg)
    outputs = ds.num_classes if ds.task != "regression" else (1 if ds.train.y.ndim == 1 else ds.train.y.shape[1])
    return ds.input_shape, outputs, ds.task


def load_dataset(cfg, seed: int = 0) -> Dataset:
    """Loads the data set a DataConfig names, optionally cut to its first `train_subset` samples."""
    name = cfg.name
    if name == "mnist1d":
        ds = load_mnist1d(cfg.num_samples)
    elif name == "digits":
        ds = load_digits(seed=0)
    elif name == "synthetic":
        ds = load_synthetic(cfg.shape, cfg.num_samples, cfg.num_classes, seed=seed)
    elif name in ("mnist", "fashion-mnist"):
        ds = load_idx_dataset(name, cfg.data_dir, cfg.download)
    elif name == "cifar10":
        ds = load_cifar10(cfg.data_dir)
    elif name == "friedman1":
        ds = load_friedman1(cfg.num_samples)
    elif name == "char-corpus":
        ds = load_char_corpus(cfg.seq_len)
    elif name == "npz":
        ds = load_npz(cfg.data_dir, seed=0)
    elif name == "shards":
        return _shards().load_shards(cfg.data_dir, cfg.train_subset)   # has its own validation split
    else:
        raise ConfigError(f"unknown data set '{name}'; choose one of: {', '.join(DATASETS)}")
    if ds.val is None:   # a data set with a validation split of its own keeps it
        ds = hold_out_validation(ds, cfg.val_fraction)
    if cfg.train_subset:
        # The statistics stay those of the subset actually trained on.
        sub = ArraySplit(ds.train.x[:cfg.train_subset], ds.train.y[:cfg.train_subset])
        ds = make_dataset(ds.name, sub, ds.test, ds.num_classes, val=ds.val, task=ds.task)
    return ds
