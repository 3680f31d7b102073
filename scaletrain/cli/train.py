"""`scaletrain train`: flags and/or a TOML config mapped onto TrainConfig.

Precedence: dataclass defaults < --recipe (or the default recipe when no argument is given)
< --config FILE < flags. Every config field has a flag, generated from the config's own
field docs so the two never drift apart.
"""

from __future__ import annotations

import argparse
import gc
import typing
from importlib import resources

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from scaletrain.config import TrainConfig, field_docs, from_mapping, load_toml, set_path, to_mapping
from scaletrain.errors import ConfigError

DEFAULT_RECIPE = "mnist1d-cnn"
# Flags whose name is not simply the field's last name.
FLAG_NAMES = {"model.name": "--model", "data.name": "--data", "precision.policy": "--precision",
              "checkpoint.every": "--checkpoint-every", "checkpoint.dir": "--checkpoint-dir",
              "checkpoint.keep": "--keep-checkpoints", "checkpoint.resume": "--resume"}
LIST_ITEM_TYPES = {"data.augment": str, "data.shape": int, "optim.betas": float,
                   "optim.step_milestones": float, "precision.fp32_modules": str,
                   "memory.block_classes": str}


def recipe_names() -> list[str]:
    folder = resources.files("scaletrain") / "recipes"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_recipe(name: str) -> dict:
    if name not in recipe_names():
        raise ConfigError(f"unknown recipe '{name}'; choose one of: {', '.join(recipe_names())}")
    with resources.as_file(resources.files("scaletrain") / "recipes" / f"{name}.toml") as path:
        return load_toml(path)


def _scalar_type(tp):
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if args else tp


def _list_parser(item_type):
    def parse(text: str):
        if text.strip() == "":
            return []
        return [item_type(part.strip()) for part in text.split(",")]
    return parse


def _option_parser(text: str):
    """--model-option key=value, the value read as TOML (numbers, lists, strings)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got '{text}'")
    key, value = text.split("=", 1)
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip(), parsed


def add_train_arguments(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """Every config field as a flag; `exclude` names dotted keys whose flag a command uses for
    something else (a sweep's --lr-scaling)."""
    parser.add_argument("--config", help="TOML file with the run configuration")
    parser.add_argument("--recipe", help="start from a named recipe (default with no arguments: "
                        f"{DEFAULT_RECIPE})")
    parser.add_argument("--model-option", action="append", type=_option_parser, dest="model_options",
                        metavar="KEY=VALUE", help="a model option, e.g. --model-option channels=32")
    for key, (tp, doc) in field_docs(TrainConfig).items():
        if key == "model.options" or key in exclude:
            continue
        flag = FLAG_NAMES.get(key, "--" + key.split(".")[-1].replace("_", "-"))
        scalar = _scalar_type(tp)
        kwargs = dict(dest=key, help=doc, default=argparse.SUPPRESS)
        if scalar is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        elif scalar is list:
            parser.add_argument(flag, type=_list_parser(LIST_ITEM_TYPES[key]), metavar="A,B,...", **kwargs)
        else:
            parser.add_argument(flag, type=scalar, **kwargs)


def config_from_args(args: argparse.Namespace, argv_given: bool) -> TrainConfig:
    cfg = TrainConfig()
    values = vars(args)
    recipe = values.get("recipe") or (None if argv_given else DEFAULT_RECIPE)
    if recipe:
        from_mapping(TrainConfig, load_recipe(recipe), base=cfg)
    if values.get("config"):
        from_mapping(TrainConfig, load_toml(values["config"]), base=cfg)
    overrides = {k: v for k, v in values.items() if "." in k or hasattr(cfg, k)}
    for key, value in overrides.items():
        if key in ("config", "recipe", "model_options"):
            continue
        set_path(cfg, key, value)
    for key, value in values.get("model_options") or []:
        cfg.model.options[key] = value
    # Re-check the merged result field by field, so a flag and a file are held to the same types.
    from_mapping(TrainConfig, to_mapping(cfg))
    cfg.validate()
    return cfg


def train_options_given(args: argparse.Namespace) -> bool:
    """Whether any training option was given (none: the default recipe, as for `train`)."""
    values, cfg = vars(args), TrainConfig()
    return (any(values.get(k) for k in ("config", "recipe", "model_options"))
            or any("." in k or hasattr(cfg, k) for k in values))


def run_train(args: argparse.Namespace, argv: list[str]) -> int:
    """`argv`: the arguments after `train`."""
    from scaletrain.distributed.launch import inside_worker, launch_from_config
    from scaletrain.run import run_training
    cfg = config_from_args(args, argv_given=len(argv) > 0)
    if cfg.distributed.nproc > 1 and not inside_worker():
        return launch_from_config(cfg, list(argv) if argv else ["--recipe", DEFAULT_RECIPE])
    run_training(cfg)
    # Free the trainer's reference cycles (DDP's reducer holds the last collectives' work objects)
    # while the interpreter is fully alive: destroying gloo work during interpreter finalization
    # can abort the process at exit (pytorch/pytorch#179291 describes the mechanism).
    gc.collect()
    return 0
