"""MNIST and Fashion-MNIST from standard IDX files (gzipped or raw), with an optional
checksum-verified download."""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import urllib.request
from pathlib import Path

import numpy as np
import torch

from scaletrain.data.dataset import ArraySplit, Dataset, as_labels, make_dataset, with_channel_dim
from scaletrain.data.source import register_dataset
from scaletrain.errors import DataError

IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049

# The published files and their MD5 sums (the same table torchvision uses).
SOURCES = {
    "mnist": ("https://ossci-datasets.s3.amazonaws.com/mnist/", {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }),
    "fashion-mnist": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/", {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    }),
}


def read_idx(path: Path, magic: int) -> np.ndarray:
    """Parses one IDX file of unsigned bytes; every malformation is a DataError naming the file."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"{path}: cannot read the file ({exc})") from None
    if len(raw) < 4:
        raise DataError(f"{path}: truncated file ({len(raw)} bytes, no IDX header)")
    found = struct.unpack(">I", raw[:4])[0]
    if found != magic:
        kind = "images" if magic == IMAGES_MAGIC else "labels"
        raise DataError(f"{path}: wrong magic number {found} (expected {magic} for IDX {kind}); "
                        "is this the right file?")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated file (header needs {header} bytes, file has {len(raw)})")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(dims))
    if len(raw) - header != expected:
        raise DataError(f"{path}: truncated file (dims {dims} need {expected} data bytes, "
                        f"found {len(raw) - header})")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(name: str, folder: Path, base_url: str | None = None) -> None:
    """Fetches the missing files, verifying each MD5 before it is moved into place."""
    default_url, files = SOURCES[name]
    base_url = base_url or default_url
    folder.mkdir(parents=True, exist_ok=True)
    for filename, md5 in files.items():
        target = folder / filename
        if target.exists() or (folder / filename[:-3]).exists():
            continue
        partial = folder / (filename + ".part")
        try:
            with urllib.request.urlopen(base_url + filename, timeout=60) as response, partial.open("wb") as out:
                out.write(response.read())
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise DataError(f"{name}: download of {base_url + filename} failed ({exc}); "
                            f"place the IDX files in {folder} by hand") from None
        got = _md5(partial)
        if got != md5:
            partial.unlink()
            raise DataError(f"{name}: {filename} failed its checksum (md5 {got}, expected {md5}); "
                            "nothing was kept")
        os.replace(partial, target)


def _find(folder: Path, stem: str) -> Path:
    for candidate in (folder / f"{stem}.gz", folder / stem):
        if candidate.exists():
            return candidate
    raise DataError(f"{folder / stem}[.gz]: file not found; put the IDX files there "
                    "or pass --download")


def load_idx_dataset(name: str, folder: str | None, download_missing: bool = False) -> Dataset:
    if folder is None:
        raise DataError(f"{name}: no data folder given; pass --data-dir DIR (holding the IDX files)")
    root = Path(folder)
    if download_missing:
        download(name, root)
    elif not root.is_dir():
        raise DataError(f"{root}: data folder not found; pass --data-dir with the folder of the IDX files")
    splits = []
    for prefix in ("train", "t10k"):
        images_path = _find(root, f"{prefix}-images-idx3-ubyte")
        labels_path = _find(root, f"{prefix}-labels-idx1-ubyte")
        images = read_idx(images_path, IMAGES_MAGIC)
        labels = read_idx(labels_path, LABELS_MAGIC)
        y = as_labels(labels.astype(np.int64), len(images), 10, str(labels_path))
        x = with_channel_dim(torch.from_numpy(images.copy()), sample_ndim=2)
        splits.append(ArraySplit(x, y))
    return make_dataset(name, splits[0], splits[1], num_classes=10)


@register_dataset("mnist", sample=((1, 28, 28), 10, "classification"))
def _mnist(cfg, seed: int) -> Dataset:
    return load_idx_dataset("mnist", cfg.data_dir, cfg.download)


@register_dataset("fashion-mnist", sample=((1, 28, 28), 10, "classification"))
def _fashion_mnist(cfg, seed: int) -> Dataset:
    return load_idx_dataset("fashion-mnist", cfg.data_dir, cfg.download)
