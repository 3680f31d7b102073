"""A cache for data sets that are generated rather than read (MNIST-1D takes about 2 s to
generate on the 2-core machine, scikit-learn's digits about 1 s to import and load), so a run
does not spend them again on every start.

An entry is content-addressed: its key is a digest of the generator's name, its version (the
generating package's version and our conversion's) and its parameters, so a change to any of them
is a new entry, never a stale one. An entry is two files, written atomically (a temporary file,
then a rename): the arrays as `.npz` (read with `allow_pickle=False`: a cache file never runs
code) and a `.json` that commits it with the arrays' SHA-256. A damaged, truncated or
uncommitted entry does not match its digest and is rebuilt, never trusted.

The folder is `$SCALETRAIN_CACHE_DIR`, else `$XDG_CACHE_HOME/scaletrain`, else
`~/.cache/scaletrain`; `SCALETRAIN_CACHE_DIR=off` turns the cache off. A folder that cannot be
written costs only the cache: the data set is generated as before.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from scaletrain.files import user_cache_dir

CACHE_ENV = "SCALETRAIN_CACHE_DIR"


def cache_dir() -> Path | None:
    """The cache's folder, or None when it is turned off."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    return user_cache_dir()


def entry_key(generator: str, version: str, params: dict) -> str:
    described = json.dumps({"generator": generator, "version": version, "params": params}, sort_keys=True)
    return hashlib.sha256(described.encode()).hexdigest()[:32]


def cached_tensors(generator: str, version: str, params: dict,
                   build: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """`build()`'s tensors, from the cache when a good entry exists, else built and stored."""
    folder = cache_dir()
    if folder is None:
        return build()
    key = entry_key(generator, version, params)
    arrays_path, commit_path = folder / f"{generator}-{key}.npz", folder / f"{generator}-{key}.json"
    found = _read(arrays_path, commit_path)
    if found is not None:
        return found
    tensors = build()
    _write(arrays_path, commit_path, tensors, {"generator": generator, "version": version, "params": params})
    return tensors


def _read(arrays_path: Path, commit_path: Path) -> dict[str, torch.Tensor] | None:
    try:
        commit = json.loads(commit_path.read_text())
        payload = arrays_path.read_bytes()
        if hashlib.sha256(payload).hexdigest() != commit["sha256"]:
            return None
        with np.load(io.BytesIO(payload), allow_pickle=False) as arrays:
            return {name: torch.from_numpy(arrays[name].copy()) for name in commit["arrays"]}
    except (OSError, ValueError, KeyError, TypeError):    # absent, unreadable or damaged: rebuild
        return None


def _write(arrays_path: Path, commit_path: Path, tensors: dict[str, torch.Tensor], described: dict) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **{name: t.numpy() for name, t in tensors.items()})
    payload = buffer.getvalue()
    commit = {**described, "arrays": list(tensors), "sha256": hashlib.sha256(payload).hexdigest()}
    try:
        arrays_path.parent.mkdir(parents=True, exist_ok=True)
        _replace(arrays_path, payload)
        _replace(commit_path, json.dumps(commit, indent=1).encode())    # last: commits the entry
    except OSError:
        pass        # a read-only or full cache folder costs only the cache


def _replace(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
