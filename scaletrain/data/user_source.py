"""`--data package.module:function`: a user's own function returns the splits (a dict with `train`,
optionally `val` and `test`, or the training split alone) in any form data/user.py takes; its
`--data-option`s are its keyword arguments. Everything it can get wrong is one line."""

from __future__ import annotations

from collections.abc import Mapping

from torch.utils.data import Subset

from scaletrain.data.dataset import ArraySplit, Dataset
from scaletrain.data.user import TorchSplit, as_dataset, as_split
from scaletrain.errors import DataError


def user_source(name: str):
    """`--data package.module:function`: the function, called with `--data-option`s, returns the
    splits: a dict with `train` (and optionally `val`, `test`), or the training split alone."""
    from scaletrain.data.source import DataSource
    return DataSource(name, lambda cfg, seed: load_user_data(name, cfg), sample=None, splits_itself=True)


def load_user_data(name: str, cfg) -> Dataset:
    from scaletrain.importing import import_function
    function = import_function(name, "data")
    try:
        result = function(**cfg.options)
    except TypeError as exc:
        raise DataError(f"data '{name}': bad --data-option ({exc})") from None
    except DataError:
        raise
    except Exception as exc:   # the user's function failed: its message, one line
        raise DataError(f"data '{name}' raised {type(exc).__name__}: {exc}") from None
    if isinstance(result, Mapping):
        unknown = set(result) - {"train", "val", "test"}
        if "train" not in result or unknown:
            raise DataError(f"data '{name}' returned a dict with keys {sorted(result)}; it needs 'train' "
                            "and may have 'val' and 'test'")
        splits = dict(result)
    else:
        splits = {"train": result}
    if cfg.train_subset:
        splits["train"] = _first(as_split(splits["train"], f"{name} (train)"), cfg.train_subset)
    return as_dataset(splits["train"], splits.get("val"), splits.get("test"), val_fraction=cfg.val_fraction,
                      name=name)


def _first(split, n: int):
    """The first `n` samples of a split (`--train-subset`)."""
    if isinstance(split, ArraySplit):
        return ArraySplit(split.x[:n], split.y[:n])
    return TorchSplit(Subset(split.dataset, range(min(n, len(split)))), split.name, split.collate_fn,
                      split.num_workers, split.batch_size)
