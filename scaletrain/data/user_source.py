"""`--data package.module:function`: a user's own function returns the splits (a dict with `train`,
optionally `val` and `test`, or the training split alone) in any form data/user.py takes; its
`--data-option`s are its keyword arguments. Everything it can get wrong is one line."""

from __future__ import annotations

from collections.abc import Mapping

from scaletrain.data.dataset import Dataset
from scaletrain.data.source import DataSource
from scaletrain.data.user import as_dataset, as_split
from scaletrain.errors import DataError, first_line
from scaletrain.user_code.importing import import_function
from scaletrain.user_code.lightning import data_module_splits, is_lightning_data_module


def user_source(name: str):
    """`--data package.module:function`: the function, called with `--data-option`s, returns the
    splits: a dict with `train` (and optionally `val`, `test`), or the training split alone; or a
    Lightning LightningDataModule class (or a function returning one), whose data loaders give them."""
    return DataSource(name, lambda cfg, seed: load_user_data(name, cfg), sample=None, splits_itself=True,
                      users_own=True)


def load_user_data(name: str, cfg) -> Dataset:
    function = import_function(name, "data")
    try:
        result = function(**cfg.options)
    except TypeError as exc:
        raise DataError(f"data '{name}': bad --data-option ({first_line(exc)})") from None
    except DataError:
        raise
    except Exception as exc:   # the user's function failed: its message, one line
        raise DataError(f"data '{name}' raised {type(exc).__name__}: {exc}") from None
    if result is None:
        raise DataError(f"data '{name}' returned None; it must return the splits: a dict with 'train' (and "
                        "optionally 'val', 'test'), the training split alone, or a LightningDataModule")
    if is_lightning_data_module(result):
        result = data_module_splits(result, name)
    if isinstance(result, Mapping):
        unknown = set(result) - {"train", "val", "test"}
        if "train" not in result or unknown:
            raise DataError(f"data '{name}' returned a dict with keys {sorted(result)}; it needs 'train' "
                            "and may have 'val' and 'test'")
        splits = dict(result)
    else:
        splits = {"train": result}
    if cfg.train_subset:
        train = as_split(splits["train"], f"{name} (train)")
        splits["train"] = train.part(0, min(cfg.train_subset, len(train)))
    return as_dataset(splits["train"], splits.get("val"), splits.get("test"), val_fraction=cfg.val_fraction,
                      name=name)

