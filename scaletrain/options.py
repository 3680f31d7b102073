"""The machinery of typed option tables: a field declared with its default, one-line doc and the
values it admits (`option`, checked by its `Check`), tables of options nested in a dataclass
(`Table`, a class's `TABLES`), and reading such dataclasses from nested mappings strictly
(`from_mapping`: an unknown key or a wrong type names the dotted key), writing them back
(`to_mapping`) and walking their leaves by dotted key. config.py declares scaletrain's options
with it; a strategy's own table (`[distributed.<name>]`) does too.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

from scaletrain.errors import ConfigError
from scaletrain.registry import Choices

# Every integer a config value or flag feeds (tensor sizes, step counters, torch's C++ API) is at
# most 64 bits wide: anything larger is refused here, not met later as an OverflowError.
INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Check:
    """The values a field admits, declared beside its default and checked once, at the boundary
    (`TrainConfig.validate`). Bounds apply to a number or to every item of a list; None passes
    (an optional field left unset)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple | None = None
    pattern: str | None = None      # a regular expression the whole text must match
    rule: str = ""                  # the pattern in words, for the error message

    def problem(self, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, list):
            for item in value:
                bad = self.problem(item)
                if bad:
                    return f"has an item that {bad}"
            return None
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}"
        if self.pattern is not None and isinstance(value, str) and not re.fullmatch(self.pattern, value):
            return f"must be {self.rule}"
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        if isinstance(value, int) and not isinstance(value, bool) and not -INT64_MAX <= value <= INT64_MAX:
            return f"must fit a 64-bit integer (at most {INT64_MAX:,})"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            for bound, ok in ((self.ge, lambda b: value >= b), (self.gt, lambda b: value > b),
                              (self.le, lambda b: value <= b), (self.lt, lambda b: value < b)):
                if bound is not None and not ok(bound):
                    return f"must be {self.describe()}"
        return None

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        parts = [f"{w} {b:g}" for b, w in ((self.ge, ">="), (self.gt, ">"), (self.le, "<="), (self.lt, "<"))
                 if b is not None]
        return " and ".join(parts)


def option(default: Any, doc: str, *, ge=None, gt=None, le=None, lt=None, choices=None, pattern=None, rule="",
       resumable: bool = False, training_only: bool = False, settled: bool = False) -> Any:
    """A config field: its default, a one-line doc (also the CLI help), the values it admits,
    whether a resume may change it (`resumable`: it changes how the run goes on, not what it is),
    whether only training reads it (`training_only`: how gradients and updates travel; a
    command that runs a saved model's forward, such as `predict`, offers no flag for it), and
    whether its `auto` is settled by the run into the value it records (`settled`: a resume given
    `auto` continues with what the run settled, and `--resume auto` finds that run)."""
    if choices is not None and not isinstance(choices, Choices):
        choices = tuple(choices)
    check = Check(ge=ge, gt=gt, le=le, lt=lt, choices=choices, pattern=pattern, rule=rule)
    meta = {"doc": doc, "check": check, "resumable": resumable, "training_only": training_only, "settled": settled}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class Table:
    """A typed table of options a strategy owns (`[distributed.<name>]`), defined in its file and
    registered with `register_table`. `owners`: the strategies that read it; a value off its
    default under another strategy is an error. A table may define `problem(cfg) -> str | None`
    for its own rules tying fields together, checked when one of its owners is chosen."""
    cls: type
    owners: tuple[str, ...]


def tables_of(obj: Any) -> dict[str, Table]:
    """The option tables a config class (or an instance) holds: its `TABLES` registry."""
    return getattr(type(obj), "TABLES", {}) if not isinstance(obj, type) else getattr(obj, "TABLES", {})


def checked_fields(obj: Any, prefix: str = ""):
    """(dotted key, Check, value) for every leaf field, the strategies' tables included."""
    for f in dataclasses.fields(obj):
        if f.metadata.get("tables"):
            for name in tables_of(obj):
                yield from checked_fields(getattr(obj, name), f"{prefix}{name}.")
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from checked_fields(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f.metadata.get("check", Check()), value


def leaf_fields(cls: type, prefix: str = ""):
    """(dotted key, dataclasses.Field, type) of every leaf field of a config class, tables included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("tables"):
            for name, table in tables_of(cls).items():
                yield from leaf_fields(table.cls, f"{prefix}{name}.")
        elif dataclasses.is_dataclass(hints[f.name]):
            yield from leaf_fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, hints[f.name]


def get_path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def set_path(obj: Any, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def field_docs(cls: type, prefix: str = "") -> dict[str, tuple[Any, str]]:
    """Maps each dotted leaf key of a config class to (type, doc)."""
    return {key: (tp, f.metadata.get("doc", "")) for key, f, tp in leaf_fields(cls, prefix)}


def training_only_keys(cls: type) -> tuple[str, ...]:
    """The dotted keys only training reads (`option(training_only=True)`)."""
    return tuple(key for key, f, _ in leaf_fields(cls) if f.metadata.get("training_only"))


def type_name(tp: Any) -> str:
    if typing.get_origin(tp) is list:
        return f"a list of {type_name(typing.get_args(tp)[0])}"
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args:
        return " or ".join(type_name(a) for a in args)
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Checks (and, for int->float, widens) a value against a field type; raises ConfigError naming the key."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(value, option, key)
            except ConfigError:
                pass
        raise ConfigError(f"config key '{key}' expects {type_name(tp)}, got {type(value).__name__} {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"config key '{key}' expects {type_name(tp)}, got {type(value).__name__} {value!r}")
        (item,) = typing.get_args(tp)
        return [coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    if not ok:
        raise ConfigError(f"config key '{key}' expects {type_name(tp)}, got {type(value).__name__} {value!r}")
    return value


def from_mapping(cls: type, data: dict, prefix: str = "", base: Any = None) -> Any:
    """Builds (or updates `base` of) a config dataclass from a nested mapping, strictly."""
    obj = base if base is not None else cls()
    upgraded = getattr(cls, "upgraded_mapping", None)   # a class that reads keys of older files
    if upgraded is not None:
        data = upgraded(data)
    hints = typing.get_type_hints(cls)
    tables = tables_of(cls)
    names = {f.name for f in dataclasses.fields(cls) if not f.metadata.get("tables")}
    data = _intotables_of(data, tables, names)
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names and key not in tables:
            raise ConfigError(f"unknown config key '{dotted}'; valid keys here: "
                              f"{', '.join(sorted(names | set(tables)))}")
        tp = tables[key].cls if key in tables else hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{dotted}' must be a table ([{dotted}])")
            from_mapping(tp, value, f"{dotted}.", getattr(obj, key))
        else:
            setattr(obj, key, coerce(value, tp, dotted))
    return obj


def _intotables_of(data: dict, tables: dict[str, Table], names: set[str]) -> dict:
    """Keys written before a strategy owned its table (`distributed.num_ps`, saved run configs and
    old TOML files) move into the one table that has a field of that name."""
    moved = {k: v for k, v in data.items() if k not in names and k not in tables}
    if not moved:
        return data
    out = {k: v for k, v in data.items() if k not in moved}
    for key, value in moved.items():
        owner = [name for name, t in tables.items() if key in {f.name for f in dataclasses.fields(t.cls)}]
        if len(owner) != 1:
            out[key] = value          # unknown: from_mapping names it
            continue
        table = out.setdefault(owner[0], {})
        if not isinstance(table, dict) or key in table:
            raise ConfigError(f"config key '{key}' is set both flat and in [distributed.{owner[0]}]; keep the table's")
        out[owner[0]] = {**table, key: value}
    return out


def to_mapping(obj: Any) -> dict:
    """The config as plain nested dicts (for TOML/JSON), None values dropped (TOML has no null)."""
    out = {}
    for f in dataclasses.fields(obj):
        if f.metadata.get("tables"):
            for name in sorted(tables_of(obj)):
                out[name] = to_mapping(getattr(obj, name))
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = to_mapping(value)
        elif value is not None:
            out[f.name] = value
    return out


def merge_mappings(base: dict, overrides: dict) -> dict:
    """`overrides` on top of `base`, tables merged key by key (model options too)."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merge_mappings(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


def flatten_mapping(mapping: dict, prefix: str = "") -> dict:
    """A config mapping as {dotted key: value}; model options stay one value (a dict)."""
    out = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and key != "options":
            out.update(flatten_mapping(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
