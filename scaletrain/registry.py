"""One registry style for every pluggable concept (models, data sets, tasks, precisions,
strategies): a `Registry` filled by decorated definitions in the modules of one package, which
the package finds by importing all of its modules (`discover`), so nothing else lists a new one.

The config owns the choice lists users may name (`Choices`, in config.py's language); a registry
adds each name it registers to its list, so the config's checks and the registry cannot drift.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Iterator, Mapping

from scaletrain.errors import ConfigError


class Choices:
    """A choice list filled by the registry that implements it, plus any names the config itself
    resolves (such as `auto`), which come first. The registered names are listed in alphabetical
    order, so no list depends on which module happened to be imported first."""

    def __init__(self, *fixed: str):
        self._fixed: tuple[str, ...] = fixed
        self._names: set[str] = set()

    def add(self, name: str) -> None:
        self._names.add(name)

    def __contains__(self, name: object) -> bool:
        return name in self._fixed or name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter((*self._fixed, *sorted(self._names - set(self._fixed))))

    def __len__(self) -> int:
        return len(set(self._fixed) | self._names)


class Registry(Mapping[str, Any]):
    """Names to the things they select. `kind` and `flag` word the one-line error for a name that
    is not there; `choices` is the config's list the names are added to (None: unchecked there)."""

    def __init__(self, kind: str, flag: str, choices: Choices | None = None):
        self.kind, self.flag, self.choices = kind, flag, choices
        self._entries: dict[str, Any] = {}

    def add(self, name: str, entry: Any) -> Any:
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._entries[name] = entry
        if self.choices is not None:
            self.choices.add(name)
        return entry

    def register(self, name: str) -> Callable[[Any], Any]:
        """Decorator: makes a class or function available as `flag NAME` (a class gets `.name`)."""
        def add(thing: Any) -> Any:
            if isinstance(thing, type):
                thing.name = name
            return self.add(name, thing)
        return add

    def get(self, name: str) -> Any:
        try:
            return self._entries[name]
        except KeyError:
            known = list(self.choices) if self.choices is not None else list(self)
            raise ConfigError(f"unknown {self.kind} '{name}'; choose one of: {', '.join(known)}") from None

    def __getitem__(self, name: str) -> Any:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))      # alphabetical: independent of import order

    def __len__(self) -> int:
        return len(self._entries)


def discover(package: Any, *, recursive: bool = False) -> None:
    """Imports every module of `package` (each registers what it defines). Sub-packages are
    entered only when `recursive`, so one with optional dependencies can stay unimported."""
    walk = pkgutil.walk_packages if recursive else pkgutil.iter_modules
    for module in walk(package.__path__, f"{package.__name__}."):
        importlib.import_module(module.name)
