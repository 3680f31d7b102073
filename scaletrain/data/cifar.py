"""CIFAR-10 from its python-batch folder (data_batch_1..5, test_batch)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from scaletrain.data.dataset import ArraySplit, Dataset, as_labels, make_dataset
from scaletrain.data.source import register_dataset
from scaletrain.errors import DataError

# What a CIFAR python batch is made of: a dict of bytes, ints, lists and one numpy array. The
# pickle names numpy's array reconstructor, ndarray and dtype (numpy 1.x or 2.x module paths);
# anything else is refused, so a crafted batch file cannot run code when loaded.
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar")}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR batch never holds (refused, not run)")


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataError(f"{path}: file not found; --data-dir must be the 'cifar-10-batches-py' folder")
    try:
        with path.open("rb") as fh:
            batch = _BatchUnpickler(fh, encoding="bytes").load()
    except Exception as exc:  # pickle raises many types on corrupt input
        raise DataError(f"{path}: not a readable CIFAR python batch ({type(exc).__name__}: {exc})") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataError(f"{path}: missing the b'data'/b'labels' entries of a CIFAR batch")
    data = np.asarray(batch[b"data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: data has shape {data.shape} and dtype {data.dtype}, "
                        "expected (N, 3072) uint8")
    return data.reshape(-1, 3, 32, 32), np.asarray(batch[b"labels"], dtype=np.int64)


def load_cifar10(folder: str | None) -> Dataset:
    if folder is None:
        raise DataError("cifar10: no data folder given; pass --data-dir cifar-10-batches-py")
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"{root}: data folder not found; pass the 'cifar-10-batches-py' folder to --data-dir")
    splits = []
    for names in ([f"data_batch_{i}" for i in range(1, 6)], ["test_batch"]):
        xs, ys = zip(*(_read_batch(root / n) for n in names), strict=True)
        x, y = np.concatenate(xs), np.concatenate(ys)
        splits.append(ArraySplit(torch.from_numpy(x), as_labels(y, len(x), 10, str(root / names[0]))))
    return make_dataset("cifar10", splits[0], splits[1], num_classes=10)


@register_dataset("cifar10", sample=((3, 32, 32), 10, "classification"))
def _cifar10(cfg, seed: int) -> Dataset:
    return load_cifar10(cfg.data_dir)
