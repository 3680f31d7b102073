"""`scaletrain train`: flags and/or a TOML config mapped onto TrainConfig.

Precedence: defaults < recipe < --config FILE < flags. The recipe is the default one
(mnist1d-cnn) unless --recipe names another or --config gives a whole configuration, so a flag
changes only what it names. Every config field has a flag, generated from the config's own
field docs so the two never drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import types
import typing
from importlib import resources

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from scaletrain.cli.flags import add_trust_code
from scaletrain.config import FLAG_ALIASES, FLAG_NAMES, TrainConfig, load_toml
from scaletrain.errors import ConfigError
from scaletrain.options import field_docs, from_mapping, merge_mappings
from scaletrain.user_code.lightning import names_lightning_module

DEFAULT_RECIPE = "mnist1d-cnn"
TOP_LEVEL_KEYS = frozenset(f.name for f in dataclasses.fields(TrainConfig))


def recipe_names() -> list[str]:
    folder = resources.files("scaletrain") / "recipes"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_recipe(name: str) -> dict:
    if name not in recipe_names():
        raise ConfigError(f"unknown recipe '{name}'; choose one of: {', '.join(recipe_names())}")
    with resources.as_file(resources.files("scaletrain") / "recipes" / f"{name}.toml") as path:
        return load_toml(path)


def _scalar_type(tp):
    """The field's type without Optional (`int | None` -> int); `list[int]` stays itself."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


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


def add_train_command_arguments(parser: argparse.ArgumentParser) -> None:
    """`train`'s flags: every config field's, and --trust-code for a resumed run's code."""
    add_train_arguments(parser)
    add_trust_code(parser)


def add_train_arguments(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = (),
                        only: tuple[str, ...] | None = None) -> None:
    """Every config field as a flag; `exclude` names dotted keys whose flag a command uses for
    something else (a sweep's --lr-scaling); `only`: just the fields whose dotted key starts with
    one of these (a command that changes part of a saved run's config, e.g. `predict`)."""
    if only is not None:
        _add_field_flags(parser, exclude, only)
        return
    if parser.description is None:
        parser.description = (f"Every option below overrides one key of the default recipe ({DEFAULT_RECIPE}: the 1-D "
                              "CNN on MNIST-1D, 6 epochs, AdamW one-cycle at lr 0.01, the time to 94 % accuracy "
                              "measured); --recipe starts from another recipe, and --config from a TOML file on the "
                              "built-in defaults. Precedence: recipe < --config < flags.")
    parser.add_argument("--config", help="TOML file with the run configuration")
    parser.add_argument("--recipe", help=f"start from a named recipe (default: {DEFAULT_RECIPE}, unless --config "
                        "is given; flags override single keys of it)")
    parser.add_argument("--target-accuracy", type=float, default=argparse.SUPPRESS, dest="target_accuracy",
                        metavar="FRACTION", help="stop once validation accuracy reaches this: the same as "
                        "--target FRACTION --target-metric accuracy")
    parser.add_argument("--model-option", action="append", type=_option_parser, dest="model_options",
                        metavar="KEY=VALUE", help="a model option, e.g. --model-option channels=32")
    parser.add_argument("--data-option", action="append", type=_option_parser, dest="data_options",
                        metavar="KEY=VALUE", help="an argument of your own package.module:function data set, "
                        "e.g. --data-option size=64")
    _add_field_flags(parser, exclude)


def _add_field_flags(parser: argparse.ArgumentParser, exclude: tuple[str, ...],
                     only: tuple[str, ...] = ("",)) -> None:
    for key, (tp, doc) in field_docs(TrainConfig).items():
        if key in ("model.options", "data.options") or key in exclude or not key.startswith(only):
            continue
        flags = (FLAG_NAMES.get(key, "--" + key.split(".")[-1].replace("_", "-")), *FLAG_ALIASES.get(key, ()))
        scalar = _scalar_type(tp)
        kwargs = dict(dest=key, help=doc, default=argparse.SUPPRESS)
        if scalar is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, **kwargs)
        elif typing.get_origin(scalar) is list:   # list[int] etc.: the item type is the field's own
            parser.add_argument(*flags, type=_list_parser(typing.get_args(scalar)[0]), metavar="A,B,...", **kwargs)
        else:
            parser.add_argument(*flags, type=scalar, **kwargs)


def given_overrides(args: argparse.Namespace) -> dict:
    """What the command line names, as one nested mapping in precedence order: a named --recipe,
    then the --config file, then flags (model options merged key by key)."""
    values = vars(args)
    out: dict = {}
    if values.get("recipe"):
        out = merge_mappings(out, load_recipe(values["recipe"]))
    if values.get("config"):
        out = merge_mappings(out, load_toml(values["config"]))
    flags: dict = {}
    for key, value in values.items():
        if "." in key or key in TOP_LEVEL_KEYS:
            *parents, last = key.split(".")
            node = flags
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
    if "target_accuracy" in values:
        flags["target"], flags["target_metric"] = values["target_accuracy"], "accuracy"
    for section, given in (("model", "model_options"), ("data", "data_options")):
        for key, value in values.get(given) or []:
            flags.setdefault(section, {}).setdefault("options", {})[key] = value
    return merge_mappings(out, flags)


def base_mapping(args: argparse.Namespace) -> dict:
    """The default recipe, unless --recipe names another or --config gives a whole configuration
    (a config file stands on the built-in defaults, as `best.toml` and sweep points are written)."""
    values = vars(args)
    return {} if values.get("recipe") or values.get("config") else load_recipe(DEFAULT_RECIPE)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The configuration a command line asks for: defaults < recipe < --config < flags; every
    value checked against its field (config.py)."""
    merged = merge_mappings(base_mapping(args), given_overrides(args))
    cfg = from_mapping(TrainConfig, merged)
    cfg.validate()
    _refuse_optimizer_flags_a_model_sets(cfg, args)
    recipe = load_recipe(vars(args)["recipe"]) if vars(args).get("recipe") else base_mapping(args)
    _drop_a_recipe_target_the_task_lacks(cfg, args, recipe)
    return cfg


def _refuse_optimizer_flags_a_model_sets(cfg: TrainConfig, args: argparse.Namespace) -> None:
    """A LightningModule's configure_optimizers sets the optimizer and its schedule: a flag naming
    one of those settings is refused, not overridden in silence (a --config file's are replaced,
    and the run's first lines say so: whole configurations, such as autotune's candidates and
    best.toml, hold every key). The user's module is imported only where such a flag is given
    with a package.module:Name model."""
    from scaletrain.user_code.lightning import OWN_OPTIMIZER_FIELDS
    given = {k.split(".", 1)[1] for k in vars(args) if k.startswith("optim.")}
    named = [f for f in OWN_OPTIMIZER_FIELDS if f in given]
    if named and names_lightning_module(cfg.model.name):
        flags = ", ".join(FLAG_NAMES.get(f"optim.{f}", "--" + f.replace("_", "-")) for f in named)
        raise ConfigError(f"{flags}: {cfg.model.name} is a LightningModule whose configure_optimizers sets the "
                          "optimizer and its schedule; drop the flag, or change configure_optimizers")


def _drop_a_recipe_target_the_task_lacks(cfg: TrainConfig, args: argparse.Namespace, recipe: dict) -> None:
    """A recipe's target is a promise about its own data set (the default recipe's 94 % accuracy on
    MNIST-1D). Trained on another data set whose task does not report that metric (`--data
    friedman1`: regression), the run has no target unless the command line or --config gives one,
    rather than refusing a metric the user never named; a `--target` given alone there refers to
    the task's own default metric."""
    values = vars(args)
    explicit = {**(load_toml(values["config"]) if values.get("config") else {}),
                **{k: v for k, v in values.items() if k in ("target", "target_metric", "target_accuracy")}}
    if cfg.target is None or "target_metric" in explicit or "target_accuracy" in explicit:
        return
    if cfg.data.name == recipe.get("data", {}).get("name"):
        return      # the recipe's own data: its target stands (and nothing is imported here)
    if "target" in explicit:
        # The user's own target on other data: its metric is the task's default (`auto`), not the
        # one the recipe's promise names (`--target 0.9` of a multi-label task means its F1).
        if "target_metric" not in recipe:
            return
        cfg.target_metric = "auto"
        return
    from scaletrain.data.registry import data_source
    from scaletrain.tasks import TASKS
    source = data_source(cfg.data.name)
    if source.users_own:
        cfg.target = None      # the user's own data: nothing is promised about it
        return
    declared = source.sample    # a fixed sample only: nothing read from disk here
    if isinstance(declared, tuple) and cfg.target_metric not in ("auto", *TASKS[declared[2]].metrics):
        cfg.target = None


def run_train(args: argparse.Namespace, argv: list[str]) -> int:
    """`argv`: the arguments after `train`."""
    cfg = config_from_args(args)        # checked before torch is imported: a typo answers at once
    from scaletrain.distributed import dist_env
    from scaletrain.distributed.cluster import cluster_from_env, cluster_problem
    from scaletrain.distributed.launch import inside_worker
    from scaletrain.distributed.strategies.registry import strategy_class
    from scaletrain.experiments.pruning import trial_callbacks_from_env
    from scaletrain.lifecycle.run import settle_config
    from scaletrain.runner import launch_training, run_training
    spec = cluster_from_env()
    if spec is not None and spec.is_evaluator:
        # The cluster's evaluator task evaluates the job's checkpoints beside it (seed 002).
        if not cfg.run_dir:
            raise ConfigError(f"the evaluator task of {spec.source} needs --run-dir: the training's run folder "
                              "(on a file system both can see)")
        from scaletrain.cli.evaluate import watch_run
        return watch_run(cfg.run_dir, device=cfg.device if cfg.device != "auto" else None)
    if spec is not None:
        servers = strategy_class(cfg.distributed, spec.world_size).degrees(cfg.distributed).servers
        problem = cluster_problem(spec, servers, cfg.distributed.nproc)
    else:
        problem = None
    if problem:
        raise ConfigError(problem)
    if cfg.distributed.strategy != "auto" and names_lightning_module(cfg.model.name):
        from scaletrain.distributed.capabilities import own_optimizer_problem
        problem = own_optimizer_problem(strategy_class(cfg.distributed, cfg.distributed.nproc),
                                        cfg.distributed.strategy, cfg.model.name)
        if problem:
            raise ConfigError(problem)
    # A cloud job's folders applied and a resume's saved configuration adopted, here as in every
    # worker: the launcher refuses in one line what its workers would.
    request = settle_config(cfg, dist_env(), flags=given_overrides(args))
    if request.config.distributed.nproc > 1 and not inside_worker():
        return launch_training(request, argv, hosts=spec.world_size if spec else 1)
    # A trial of `scaletrain tune` or `autotune` reports each epoch's metric to its study, which may prune it.
    run_training(request, callbacks=trial_callbacks_from_env())
    # Free the trainer's reference cycles (DDP's reducer holds the last collectives' work objects)
    # while the interpreter is fully alive: destroying gloo work during interpreter finalization
    # can abort the process at exit (pytorch/pytorch#179291 describes the mechanism).
    gc.collect()
    return 0
