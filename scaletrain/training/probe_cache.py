"""The probe's decisions kept for the next run of the same model on this machine (probe.py).

One JSON file in the user's cache folder, an entry per key: the model's structure (a meta build),
the input's shape and dtype, the batch, the device, the thread count, the questions asked (the
precisions, and whether compile) and torch's version. The file is the user's: a damaged one is
ignored, and probe.py takes from an entry only what this run could have chosen itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

from scaletrain.errors import UserError
from scaletrain.files import read_json, user_cache_dir

CACHE_FILE = "probe-decisions.json"
CACHE_ENTRIES = 200      # the newest kept: one per model and machine a user trains


def cache_key(model: torch.nn.Module, example: torch.Tensor, batch: int, device_name: str, threads: int,
              candidates: list[str]) -> str:
    """What a decision holds for: the model's structure (its modules and their shapes, as repr
    prints them), the input's shape and dtype, the batch, the device, the thread count, the
    candidates and torch's version."""
    parts = {"structure": hashlib.sha256(repr(model).encode()).hexdigest(),
             "input": [list(example.shape[1:]), str(example.dtype)], "batch": batch, "device": device_name,
             "threads": threads, "candidates": candidates, "torch": torch.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _cache_path() -> Path:
    return user_cache_dir() / CACHE_FILE


def cached_entry(key: str) -> dict | None:
    """The entry kept under `key`, or None (none kept, or a file that is not ours: ignored)."""
    path = _cache_path()
    if not path.exists():
        return None
    try:
        entries = read_json(path, "the probe's cache")
    except UserError:
        return None
    entry = entries.get(key) if isinstance(entries, dict) else None
    return entry if isinstance(entry, dict) and isinstance(entry.get("run_id"), str) else None


def remember(key: str, entry: dict, run_id: str) -> None:
    """Keeps a measured decision for the next run of the same model here (best effort: a cache
    that cannot be written costs the next run a probe, never this one its training)."""
    path = _cache_path()
    try:
        entries = read_json(path, "the probe's cache") if path.exists() else {}
    except UserError:
        entries = {}
    if not isinstance(entries, dict):
        entries = {}
    entries[key] = {**entry, "run_id": run_id, "time": time.time()}
    entries = dict(sorted(entries.items(), key=lambda kv: kv[1].get("time", 0)
                          if isinstance(kv[1], dict) else 0)[-CACHE_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries))
        tmp.replace(path)
    except OSError:
        pass
