"""The search space of `scaletrain tune`, read from a TOML file. Each table is one parameter,
named by a train option (`lr`, `batch_size`, `weight_decay`, `optimizer`), a dotted config key
(`optim.lr`) or a model option (`"model.options.channels"`), or mapped with `key = ...`:

    [lr]
    type = "float"        # float (linear or log scale), int, or categorical
    low = 1e-4
    high = 0.1
    log = true

    [batch_size]
    type = "categorical"
    choices = [32, 64, 128]

Every value is checked against the config field's type when the file is read, so a bad space
fails before the first trial starts.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

from scaletrain.config import FLAG_NAMES, TrainConfig, load_toml
from scaletrain.errors import ConfigError
from scaletrain.options import coerce, field_docs, set_path

TYPES = ("float", "int", "categorical")
SETTINGS = {"float": {"type", "low", "high", "log", "step", "key"},
            "int": {"type", "low", "high", "log", "step", "key"},
            "categorical": {"type", "choices", "key"}}
# Keys a search makes no sense over: where results go and how the run is recorded.
UNTUNABLE_PREFIXES = ("tracking.", "checkpoint.", "run_dir", "summary_json", "metrics_format", "progress")


def _config_keys() -> dict[str, object]:
    return {key: tp for key, (tp, _) in field_docs(TrainConfig).items() if key != "model.options"}


def resolve_key(name: str) -> str:
    """The dotted config key a parameter name stands for."""
    keys = _config_keys()
    if name.startswith("model.options.") and len(name) > len("model.options."):
        return name
    if name in keys:
        return name
    by_flag = {flag.lstrip("-").replace("-", "_"): key for key, flag in FLAG_NAMES.items()}
    if name.replace("-", "_") in by_flag:
        return by_flag[name.replace("-", "_")]
    leaf = [key for key in keys if key.split(".")[-1] == name.replace("-", "_")]
    if len(leaf) == 1:
        return leaf[0]
    raise ConfigError(f"unknown parameter '{name}': not a train option; use an option name (lr, batch_size, "
                      "weight_decay, optimizer, ...), a dotted config key (optim.lr) or a model option "
                      "(\"model.options.channels\"), or map it with key = \"...\"")


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    key: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()

    def suggest(self, trial):
        if self.type == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return trial.suggest_int(self.name, self.low, self.high, log=self.log, step=self.step or 1)
        if all(isinstance(c, (bool, int, float, str)) for c in self.choices):
            return trial.suggest_categorical(self.name, list(self.choices))
        # Optuna stores only scalar choices; a list choice (hidden = [[64], [128, 64]]) goes in as its JSON text.
        return json.loads(trial.suggest_categorical(self.name, [json.dumps(c) for c in self.choices]))

    def decode(self, stored):
        """A value as Optuna stored it, back in the config's terms."""
        if (self.type == "categorical" and isinstance(stored, str)
                and json.dumps(stored) not in map(json.dumps, self.choices)):
            return json.loads(stored)
        return stored


def _check_value(value, key: str, where: str):
    if key.startswith("model.options."):
        return value
    try:
        return coerce(value, _config_keys()[key], key)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _parameter(name: str, spec, path: Path) -> Parameter:   # noqa: C901 - one check per key of a parameter's spec; flat
    where = f"space file {path}, parameter '{name}'"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a table ([{name}] with type = ...)")
    kind = spec.get("type")
    if kind is None and spec and all(isinstance(v, dict) for v in spec.values()):
        inner = next(iter(spec))
        raise ConfigError(f"space file {path}: [{name}.{inner}] is a table inside [{name}] in TOML, not the key "
                          f"{name}.{inner}; write [\"{name}.{inner}\"] (quoted) or [{inner}], with type = ...")
    if kind not in TYPES:
        raise ConfigError(f"{where}: type must be one of {', '.join(TYPES)} (got {kind!r})")
    unknown = set(spec) - SETTINGS[kind]
    if unknown:
        raise ConfigError(f"{where} has unknown setting(s) {', '.join(sorted(unknown))}; a {kind} parameter takes "
                          f"{', '.join(sorted(SETTINGS[kind]))}")
    try:
        key = resolve_key(spec.get("key", name))
    except ConfigError as exc:
        raise ConfigError(f"space file {path}: {exc}") from None
    if key.startswith(UNTUNABLE_PREFIXES):
        raise ConfigError(f"{where}: '{key}' decides where results go, not how a model trains; it cannot be searched")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}: a categorical parameter needs a non-empty list: choices = [...]")
        return Parameter(name, key, kind, choices=tuple(_check_value(c, key, where) for c in choices))
    for bound in ("low", "high"):
        if bound not in spec:
            raise ConfigError(f"{where}: a {kind} parameter needs low and high")
        number = spec[bound]
        if (isinstance(number, bool) or not isinstance(number, (int, float))
                or (kind == "int" and not isinstance(number, int))):
            raise ConfigError(f"{where}: {bound} must be {'an integer' if kind == 'int' else 'a number'} (got "
                              f"{number!r})")
    low, high = spec["low"], spec["high"]
    if low > high:
        raise ConfigError(f"{where}: low ({low}) is greater than high ({high})")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log must be true or false (got {log!r})")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log scale needs low > 0 (got low = {low}); use a positive bound or log = false")
    step = spec.get("step")
    if step is not None and (log or isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0):
        raise ConfigError(f"{where}: step must be a positive number and cannot be combined with log = true")
    _check_value(float(low) if kind == "float" else low, key, where)
    _check_value(float(high) if kind == "float" else high, key, where)
    if kind == "float":
        low, high = float(low), float(high)
    return Parameter(name, key, kind, low, high, log, step)


@dataclass(frozen=True, slots=True)
class SearchSpace:
    parameters: tuple[Parameter, ...]
    text: str   # the file as written, kept with the study

    @classmethod
    def load(cls, path: str | Path) -> SearchSpace:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"space file {path} does not exist; pass a TOML file with one table per parameter")
        try:
            data = load_toml(path)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("config file", "space file")) from None
        if not data:
            raise ConfigError(f"space file {path} defines no parameters; add a table such as [lr] with "
                              "type = \"float\", low, high")
        params = tuple(_parameter(name, spec, path) for name, spec in data.items())
        keys = [p.key for p in params]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise ConfigError(f"space file {path} sets {', '.join(duplicates)} more than once")
        return cls(params, path.read_text())

    def suggest(self, trial) -> dict[str, object]:
        """The trial's values, by parameter name."""
        return {p.name: p.suggest(trial) for p in self.parameters}

    def apply(self, base: TrainConfig, values: dict[str, object]) -> TrainConfig:
        cfg = copy.deepcopy(base)
        for p in self.parameters:
            value = values[p.name]
            if p.key.startswith("model.options."):
                cfg.model.options[p.key.split(".", 2)[2]] = value
            else:
                set_path(cfg, p.key, coerce(value, _config_keys()[p.key], p.key))
        cfg.validate()
        return cfg
