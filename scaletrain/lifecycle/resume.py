"""What may change when a run is resumed, and the configuration a resume continues with.

A resume continues the run with the configuration saved in its folder; flags given with the
resume may change only what can change mid-run without making it a different experiment (how
long it trains, when it stops, how it logs and checkpoints, how many processes run it). A change
of model, data, optimizer, precision or batch plan is an error naming the keys.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from scaletrain.config import TrainConfig, resumable_keys, settled_keys
from scaletrain.errors import ConfigError
from scaletrain.options import flatten_mapping, from_mapping, get_path, merge_mappings, set_path, to_mapping

# Which keys may change is declared on each field (`resumable=True` in config.py): how long it
# trains and when it stops, how it runs (numerically equivalent), what it writes and shows.
# `tracking.run_id` is one: the folder's id wins, and plan_run refuses a --run-id naming another.


def locked_differences(saved: TrainConfig, given: TrainConfig, unnamed: Collection[str] = ()) -> dict[str, tuple]:
    """{dotted key: (saved value, given value)} for every key that differs and may not change.
    `unnamed`: fixed keys the command did not name and the run settled itself (the batch a user's
    DataLoader fixes: plan.py), left out."""
    a, b = flatten_mapping(to_mapping(saved)), flatten_mapping(to_mapping(given))
    # A settled key given as `auto` asks for what the run settled, whatever that was.
    mutable = {*resumable_keys(), *unnamed, *(k for k in settled_keys() if b.get(k) == "auto")}
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k not in mutable and not _same(a.get(k), b.get(k))}


def _same(a, b) -> bool:
    """Equal values, NaN equal to NaN (a value is itself, whatever IEEE says)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def describe_differences(diffs: dict[str, tuple]) -> str:
    return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in diffs.items())


def check_same_run(saved: TrainConfig, given: TrainConfig, folder, unnamed: Collection[str] = ()) -> None:
    """Raises the one resume error: `given` changes a key fixed for the run saved in `folder`
    (`unnamed`: keys the command did not name, which the run settled itself: plan.py)."""
    diffs = locked_differences(saved, given, unnamed)
    if diffs:
        raise ConfigError(f"cannot resume {folder} with a different configuration ({describe_differences(diffs)}); "
                          "these keys are fixed for a run: drop those flags to continue it, or start a new run "
                          "(another --run-dir, or --overwrite)")


def resume_config(saved: dict, overrides: dict, folder: str) -> TrainConfig:
    """The configuration a resume continues with: the run's saved one, with the given overrides
    applied where they may change. Raises ConfigError naming every locked key that would change."""
    saved_cfg = from_mapping(TrainConfig, saved)
    merged = from_mapping(TrainConfig, merge_mappings(saved, overrides))
    # A settled key spelled out as `auto` (`--precision auto`) means what it resolved to when the
    # run started: the saved value.
    for key in settled_keys():
        if get_path(merged, key) == "auto":
            set_path(merged, key, get_path(saved_cfg, key))
    check_same_run(saved_cfg, merged, folder)
    return merged
