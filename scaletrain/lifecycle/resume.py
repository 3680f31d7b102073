"""What may change when a run is resumed, and the configuration a resume continues with.

A resume continues the run with the configuration saved in its folder; flags given with the
resume may change only what can change mid-run without making it a different experiment (how
long it trains, when it stops, how it logs and checkpoints, how many processes run it). A change
of model, data, optimizer, precision or batch plan is an error naming the keys.
"""

from __future__ import annotations

from scaletrain.config import TrainConfig, flatten_mapping, from_mapping, to_mapping
from scaletrain.errors import ConfigError

MUTABLE_ON_RESUME = frozenset({
    # how long and when to stop
    "epochs", "patience", "target", "target_metric", "early_stopping_patience", "eval_each_epoch",
    # how it runs (numerically equivalent)
    "device", "compile", "compile_mode", "cuda_graphs", "steps_per_execution",
    "memory.activation_checkpointing", "memory.block_classes",
    "data.num_workers", "data.prefetch", "data.val_batch_size", "data.placement", "data.download",
    "distributed.strategy", "distributed.nproc", "distributed.max_restarts", "distributed.backend",
    "distributed.bucket_cap_mb", "distributed.init_timeout_s", "distributed.step_timeout_s",
    # what it writes and shows
    "log_every", "progress", "summary_json", "save_model", "run_dir", "overwrite",
    "checkpoint.every", "checkpoint.keep", "checkpoint.resume", "checkpoint.dir",
    "tracking.sample_interval_s", "tracking.tensorboard", "tracking.record",
    "tracking.run_id",   # the folder's id wins; plan_run refuses a --run-id that names another
})


def locked_differences(saved: TrainConfig, given: TrainConfig) -> dict[str, tuple]:
    """{dotted key: (saved value, given value)} for every key that differs and may not change."""
    a, b = flatten_mapping(to_mapping(saved)), flatten_mapping(to_mapping(given))
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k not in MUTABLE_ON_RESUME and a.get(k) != b.get(k)}


def describe_differences(diffs: dict[str, tuple]) -> str:
    return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in diffs.items())


def merge_mappings(base: dict, overrides: dict) -> dict:
    """`overrides` on top of `base`, tables merged key by key (model options too)."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merge_mappings(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


def resume_config(saved: dict, overrides: dict, folder: str) -> TrainConfig:
    """The configuration a resume continues with: the run's saved one, with the given overrides
    applied where they may change. Raises ConfigError naming every locked key that would change."""
    saved_cfg = from_mapping(TrainConfig, saved)
    merged = from_mapping(TrainConfig, merge_mappings(saved, overrides))
    diffs = locked_differences(saved_cfg, merged)
    if diffs:
        raise ConfigError(f"cannot resume {folder} with a different configuration ({describe_differences(diffs)}); "
                          "these keys are fixed for a run: drop those flags to continue it, or start a new run "
                          "(another --run-dir, or --overwrite)")
    return merged
