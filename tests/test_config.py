"""Config values are checked once, beside their fields: each check can fail, and the choices the
config declares are exactly what the registries implement."""

import dataclasses

import pytest

from scaletrain.config import COMPILE_MODES, DATA_SETS, PRECISIONS, STRATEGIES, TrainConfig
from scaletrain.errors import ConfigError
from scaletrain.options import Check, field_docs, from_mapping, set_path


def test_declared_choices_are_what_the_registries_implement():
    from scaletrain.config import TASKS as TASK_CHOICES
    from scaletrain.data import DATA_SOURCES
    from scaletrain.distributed import STRATEGIES as IMPLEMENTED
    from scaletrain.precision import POLICIES
    from scaletrain.tasks import TASKS
    assert list(PRECISIONS) == ["auto", *POLICIES] and "bf16-mixed" in PRECISIONS
    assert list(STRATEGIES) == ["auto", *IMPLEMENTED] and "hsdp" in STRATEGIES
    assert list(DATA_SETS) == list(DATA_SOURCES) and "char-corpus" in DATA_SETS
    assert list(TASK_CHOICES) == ["auto", *TASKS] and "language-model" in TASK_CHOICES
    assert "max-autotune-no-cudagraphs" in COMPILE_MODES


def test_every_numeric_field_declares_what_it_admits():
    """A new number field without a range would let a negative or zero value through unchecked."""
    unchecked = []
    for key, (tp, _doc) in field_docs(TrainConfig).items():
        args = set(getattr(tp, "__args__", (tp,))) - {type(None)}
        if args & {int, float}:
            obj = TrainConfig()
            *parents, last = key.split(".")
            for part in parents:
                obj = getattr(obj, part)
            check = next(f for f in dataclasses.fields(obj) if f.name == last).metadata["check"]
            if check == Check():
                unchecked.append(key)
    assert unchecked == []


@pytest.mark.parametrize("key,value,message", [
    ("optim.clip_grad_norm", -1.0, "must be > 0"),
    ("optim.clip_grad_norm", float("inf"), "must be a finite number"),
    ("data.val_batch_size", 0, "must be >= 1"),
    ("optim.momentum", 1.0, "must be >= 0 and < 1"),
    ("optim.betas", [0.9, 1.5], "has an item that must be >= 0 and < 1"),
    ("optim.min_lr_ratio", 1.5, "must be >= 0 and <= 1"),
    ("precision.policy", "fp4", "must be one of auto, bf16-mixed"),
    ("target", float("nan"), "must be a finite number"),
    ("target_metric", "Val Acc", "must be a metric name"),
    ("task", "translation", "must be one of auto"),
    ("tracking.run_id", "-x", "must be 1-64 letters"),
    ("tracking.run_id", "x" * 65, "must be 1-64 letters"),
])
def test_out_of_range_values_name_the_key(key, value, message):
    cfg = TrainConfig()
    set_path(cfg, key, value)
    with pytest.raises(ConfigError, match=f"config key '{key}' {message}"):
        cfg.validate()


def test_boundary_values_pass():
    cfg = TrainConfig()
    for key, value in (("optim.momentum", 0.0), ("data.num_workers", 0), ("target", 1.0),
                       ("optim.min_lr_ratio", 1.0), ("tracking.run_id", "a" * 64), ("device", "cuda:1"),
                       ("optim.clip_grad_norm", None), ("seed", 0)):
        set_path(cfg, key, value)
    cfg.validate()


def test_a_target_fraction_above_one_is_refused_for_accuracy_but_not_for_perplexity():
    cfg = TrainConfig(target=1.5, target_metric="accuracy")
    with pytest.raises(ConfigError, match="config key 'target' must be at most 1 for accuracy"):
        cfg.validate()
    TrainConfig(target=1.5, target_metric="perplexity").validate()


def test_configs_written_with_target_accuracy_still_load_as_an_accuracy_target():
    """Saved run configs and older recipes name `target_accuracy`: they keep loading."""
    cfg = from_mapping(TrainConfig, {"target_accuracy": 0.9, "epochs": 3})
    assert (cfg.target, cfg.target_metric, cfg.epochs) == (0.9, "accuracy", 3)
    with pytest.raises(ConfigError, match="'target_accuracy' and 'target' are both set"):
        from_mapping(TrainConfig, {"target_accuracy": 0.9, "target": 0.8})


def test_a_runs_identity_ignores_what_a_resume_may_change_and_how_a_number_is_spelled():
    """What a checkpoint records of its run (issue 66 I1): the configuration less the resumable
    keys, with 15 and 15.0 one value (a config read back turns a float field's integers into floats)."""
    from scaletrain.config import identity_digest
    from scaletrain.options import from_mapping, to_mapping
    cfg = TrainConfig()
    base = identity_digest(cfg)
    read_back = from_mapping(TrainConfig, to_mapping(cfg))
    assert read_back.optim.step_milestones == [15.0, 25.0, 35.0] and identity_digest(read_back) == base
    read_back.epochs, read_back.distributed.nproc = 40, 4          # a resume may change these
    assert identity_digest(read_back) == base
    read_back.optim.lr = 0.5                                       # another run
    assert identity_digest(read_back) != base


def test_a_setting_given_as_auto_finds_and_continues_the_value_its_run_settled():
    """A probed run records bf16-mixed (and, under fp8, the layer shapes it measured) where the
    command said `auto`: the same command with --resume auto finds that run and continues what it
    settled, while a value named otherwise is another run. (Before, `--resume auto` without
    --run-dir compared the command's `auto`, then the rule's choice, with what the run recorded:
    a run whose probe chose against the rule, or whose fp8 shapes were measured, was never found.)"""
    from scaletrain.config import settled_keys
    from scaletrain.lifecycle.resume import locked_differences, resume_config
    from scaletrain.options import to_mapping
    assert settled_keys() == {"precision.policy", "precision.fp8_shapes"}
    saved = TrainConfig()
    saved.precision.policy, saved.precision.fp8_shapes = "fp8", "1024x4096"
    assert locked_differences(saved, TrainConfig()) == {}
    named = TrainConfig()
    named.precision.policy = "fp32"
    assert set(locked_differences(saved, named)) == {"precision.policy"}
    merged = resume_config(to_mapping(saved), {"precision": {"policy": "auto", "fp8_shapes": "auto"}, "epochs": 40},
                           "runs/a")
    assert (merged.precision.policy, merged.precision.fp8_shapes, merged.epochs) == ("fp8", "1024x4096", 40)
