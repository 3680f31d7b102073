"""User data sets in .npz files: arrays `x` and `y`, optionally `x_test` and `y_test`."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from scaletrain.data.dataset import ArraySplit, as_features, as_labels, infer_num_classes, make_dataset, random_split
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
    declared = None
    if "num_classes" in arrays:
        value = arrays["num_classes"]
        if value.ndim != 0 or not np.issubdtype(value.dtype, np.integer) or int(value) < 2:
            raise DataError(f"{file}: num_classes must be one integer >= 2, got {value!r}")
        declared = int(value)
    y = as_labels(arrays["y"], len(x), declared, f"{file}[y]")
    num_classes = declared or infer_num_classes(y, f"{file}[y]")
    if "x_test" in arrays or "y_test" in arrays:
        if not ("x_test" in arrays and "y_test" in arrays):
            raise DataError(f"{file}: x_test and y_test must come together")
        if np.ndim(arrays["x_test"]) == 0 or len(arrays["x_test"]) == 0:
            raise DataError(f"{file}: x_test holds no samples; save at least one, or leave x_test and y_test out")
        xt = as_features(arrays["x_test"], f"{file}[x_test]")
        xt = xt.unsqueeze(1) if xt.ndim == 2 else xt
        yt = as_labels(arrays["y_test"], len(xt), num_classes, f"{file}[y_test]")
        train, test = ArraySplit(x, y), ArraySplit(xt, yt)
    else:
        if len(x) < 2:
            raise DataError(f"{file}: {len(x)} sample(s) cannot be split into train and test; add samples or "
                            "save x_test and y_test")
        train, test = random_split(x, y, test_fraction=0.2, seed=seed)
    return make_dataset(file.name, train, test, num_classes=num_classes)
