"""User data sets in .npz files: arrays `x` and `y`, optionally `x_test`/`y_test`, `x_val`/`y_val`
(a validation split of their own) and `num_classes`. Integer `y` are class labels; floating-point
`y` are regression targets, (N,) or (N, k)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch

from scaletrain.data.dataset import ArraySplit, as_features, as_labels, infer_num_classes, make_dataset, random_split
from scaletrain.data.source import register_dataset
from scaletrain.errors import DataError


def load_npz(path: str | None, seed: int = 0):
    if path is None:
        raise DataError("npz: no file given; pass --data-dir PATH.npz (arrays x and y)")
    file = Path(path)
    if not file.is_file():
        raise DataError(f"{file}: file not found; pass the path of an .npz file with arrays x and y")
    try:
        with np.load(file, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DataError(f"{file}: not a readable .npz file ({exc})") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise DataError(f"{file}: missing array(s) {missing}; found {sorted(arrays)} "
                        "(save with np.savez(path, x=..., y=...))")
    if np.ndim(arrays["x"]) == 0 or len(arrays["x"]) == 0:
        raise DataError(f"{file}: x holds no samples; save at least one sample per split")
    x = as_features(arrays["x"], f"{file}[x]")
    if x.ndim < 2:
        raise DataError(f"{file}: x must have a sample dimension and features, got shape {tuple(x.shape)}")
    if x.ndim == 2:  # (N, F) -> (N, 1, F): a one-channel sequence
        x = x.unsqueeze(1)
    if np.issubdtype(arrays["y"].dtype, np.floating):   # real-valued targets: a regression data set
        return _regression(arrays, file, x, seed)
    declared = None
    if "num_classes" in arrays:
        value = arrays["num_classes"]
        if value.ndim != 0 or not np.issubdtype(value.dtype, np.integer) or int(value) < 2:
            raise DataError(f"{file}: num_classes must be one integer >= 2, got {value!r}")
        declared = int(value)
    y = as_labels(arrays["y"], len(x), declared, f"{file}[y]")
    num_classes = declared or infer_num_classes(y, f"{file}[y]")
    test = _optional_split(arrays, file, "test", num_classes)
    if test is not None:
        train = ArraySplit(x, y)
    else:
        if len(x) < 2:
            raise DataError(f"{file}: {len(x)} sample(s) cannot be split into train and test; add samples or "
                            "save x_test and y_test")
        train, test = random_split(x, y, test_fraction=0.2, seed=seed)
    # A validation split of the file's own (x_val, y_val); otherwise one is held out of training.
    val = _optional_split(arrays, file, "val", num_classes)
    return make_dataset(file.name, train, test, num_classes=num_classes, val=val)


def _targets(y: np.ndarray, n: int, source: str) -> torch.Tensor:
    """Real-valued targets, (N,) or (N, k), float32 and finite."""
    t = as_features(y, source)
    if t.ndim not in (1, 2) or len(t) != n:
        raise DataError(f"{source}: regression targets must have shape ({n},) or ({n}, k), got {tuple(t.shape)}")
    return t


def _regression(arrays: dict, file: Path, x: torch.Tensor, seed: int):
    y = _targets(arrays["y"], len(x), f"{file}[y]")
    splits = {}
    for name in ("test", "val"):
        xk, yk = f"x_{name}", f"y_{name}"
        if (xk in arrays) != (yk in arrays):
            raise DataError(f"{file}: {xk} and {yk} must come together")
        if xk in arrays:
            xs = as_features(arrays[xk], f"{file}[{xk}]")
            xs = xs.unsqueeze(1) if xs.ndim == 2 else xs
            splits[name] = ArraySplit(xs, _targets(arrays[yk], len(xs), f"{file}[{yk}]"))
    if "test" in splits:
        train = ArraySplit(x, y)
    elif len(x) < 2:
        raise DataError(f"{file}: {len(x)} sample(s) cannot be split into train and test; add samples or "
                        "save x_test and y_test")
    else:
        train, splits["test"] = random_split(x, y, test_fraction=0.2, seed=seed)
    return make_dataset(file.name, train, splits["test"], num_classes=1, val=splits.get("val"), task="regression")


def _optional_split(arrays: dict, file: Path, name: str, num_classes: int) -> ArraySplit | None:
    """The file's x_<name>/y_<name> pair, checked like the training arrays; None when absent."""
    xk, yk = f"x_{name}", f"y_{name}"
    if xk not in arrays and yk not in arrays:
        return None
    if not (xk in arrays and yk in arrays):
        raise DataError(f"{file}: {xk} and {yk} must come together")
    if np.ndim(arrays[xk]) == 0 or len(arrays[xk]) == 0:
        raise DataError(f"{file}: {xk} holds no samples; save at least one, or leave {xk} and {yk} out")
    x = as_features(arrays[xk], f"{file}[{xk}]")
    x = x.unsqueeze(1) if x.ndim == 2 else x
    return ArraySplit(x, as_labels(arrays[yk], len(x), num_classes, f"{file}[{yk}]"))


@register_dataset("npz", users_own=True)      # shape and classes are read from the file
def _npz(cfg, seed: int):
    return load_npz(cfg.data_dir, seed=0)
