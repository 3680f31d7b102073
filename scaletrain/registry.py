"""One registry style for every pluggable concept (models, data sets, tasks, precisions,
strategies): a `Registry` filled by decorated definitions in the modules of one package. The
package's modules are found from the names they declare (`Declarations`), and one is imported
when a name it declares is asked for, so nothing else lists a new one; a user's own package is
found by importing all of its modules (`discover`).

The config owns the choice lists users may name (`Choices`, in config.py's language); a registry
adds each name it registers to its list, so the config's checks and the registry cannot drift.
A choice list also knows the names its package *declares* (`Declarations`: the registering calls,
read from the source without importing it), so the config's checks, `--help` and `scaletrain
list` answer without importing the package, and with it torch. tests/test_architecture.py checks
that the declared names are exactly the registered ones.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from scaletrain.errors import ConfigError


class Declarations:
    """The names the modules of `package` (and its sub-packages) register with `registrar`, read
    from their source: a call `registrar("name", ...)` (a decorator or a plain call) whose first
    argument is a string literal. A `variants=` argument is read too when it is a string, a literal
    tuple, or a module-level literal dict or tuple (`variants=tuple(PRESETS)`)."""

    def __init__(self, package: str, registrar: str):
        self.package, self.registrar = package, registrar
        self._found: dict[str, tuple[str, ...] | str] | None = None
        self._modules: dict[str, str] = {}

    def variants(self) -> dict[str, tuple[str, ...] | str]:
        """Each declared name and what may follow `NAME-` (an empty tuple: nothing)."""
        if self._found is None:
            self._found = {}
            spec = importlib.util.find_spec(self.package)
            for root in spec.submodule_search_locations or ():
                for path in sorted(Path(root).rglob("*.py")):
                    text = path.read_text(encoding="utf-8")
                    if self.registrar + "(" in text:
                        found = self._read(ast.parse(text, filename=str(path)))
                        module = ".".join((self.package, *path.relative_to(root).with_suffix("").parts))
                        self._modules.update(dict.fromkeys(found, module.removesuffix(".__init__")))
                        self._found.update(found)
        return self._found

    def modules(self) -> dict[str, str]:
        """Each declared name and the module that registers it (imported to register it)."""
        self.variants()
        return self._modules

    def __iter__(self) -> Iterator[str]:
        return iter(self.variants())

    def _read(self, tree: ast.Module) -> dict[str, tuple[str, ...] | str]:
        constants = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                     for t in node.targets if isinstance(t, ast.Name)}
        found = {}
        for call in ast.walk(tree):
            if (isinstance(call, ast.Call) and _called_name(call.func) == self.registrar and call.args
                    and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
                variants = next((k.value for k in call.keywords if k.arg == "variants"), None)
                found[call.args[0].value] = _literal_names(variants, constants)
        return found


def _called_name(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _literal_names(node: ast.expr | None, constants: dict[str, ast.expr]) -> tuple[str, ...] | str:
    """A variants argument as written: "D-K", ("a", "b"), NAME or tuple(NAME) of a module-level
    literal; () when there is none or it is not written as a literal."""
    if isinstance(node, ast.Call) and _called_name(node.func) == "tuple" and len(node.args) == 1:
        node = node.args[0]
    if isinstance(node, ast.Name):
        node = constants.get(node.id)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    keys = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.Tuple, ast.List)) else []
    return tuple(k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str))


class Choices:
    """A choice list: the names the config itself resolves (such as `auto`), which come first, then
    the names its package declares (`declared`, read without importing it) and any name a registry
    adds as it registers (a user's own package), in alphabetical order, so no list depends on
    which module happened to be imported first."""

    def __init__(self, *fixed: str, declared: Declarations | None = None, importable: bool = False):
        self._fixed: tuple[str, ...] = fixed
        self._names: set[str] = set()
        self.declared = declared
        # Also a user's own `package.module:function` (importing.py), imported where it is used.
        self.importable = importable

    def add(self, name: str) -> None:
        self._names.add(name)

    def _all(self) -> set[str]:
        return self._names | set(self.declared or ())

    def __contains__(self, name: object) -> bool:
        if self.importable and isinstance(name, str) and ":" in name:
            from scaletrain.user_code.importing import FUNCTION_NAME
            return bool(FUNCTION_NAME.fullmatch(name))
        declared = self.declared.variants() if self.declared is not None else {}
        return name in self._fixed or name in self._names or name in declared

    def __iter__(self) -> Iterator[str]:
        return iter((*self._fixed, *sorted(self._all() - set(self._fixed))))

    def __len__(self) -> int:
        return len(set(self._fixed) | self._all())


class Registry(Mapping[str, Any]):
    """Names to the things they select. `kind` and `flag` word the one-line error for a name that
    is not there; `choices` is the config's list the names are added to (None: unchecked there).

    Entries are imported on first use: asking for one name imports only the module its choices
    declare for it (a run on one device never imports the sharding strategies and
    torch.distributed.checkpoint with them); listing them all imports every declaring module."""

    def __init__(self, kind: str, flag: str, choices: Choices | None = None):
        self.kind, self.flag, self.choices = kind, flag, choices
        self._entries: dict[str, Any] = {}
        self._all_loaded = False

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

    def _declared_modules(self) -> dict[str, str]:
        declared = self.choices.declared if self.choices is not None else None
        return declared.modules() if declared is not None else {}

    def _load(self, name: str) -> None:
        module = self._declared_modules().get(name)
        if name not in self._entries and module is not None:
            importlib.import_module(module)         # registers it

    def _load_all(self) -> None:
        if not self._all_loaded:
            for module in sorted(set(self._declared_modules().values())):
                importlib.import_module(module)
            self._all_loaded = True

    def get(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            known = list(self.choices) if self.choices is not None else list(self)
            raise ConfigError(f"unknown {self.kind} '{name}'; choose one of: {', '.join(known)}") from None

    def __getitem__(self, name: str) -> Any:
        if (name not in self._entries and self.choices is not None and self.choices.importable
                and isinstance(name, str) and ":" in name):
            # A user's own `package.module:Name`: imported on lookup (once a process, by user_code/),
            # never listed among the registered entries (it is the user's, not ours).
            from scaletrain.user_code.importing import import_function
            return import_function(name, self.kind)
        self._load(name)
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        self._load_all()
        return iter(sorted(self._entries))      # alphabetical: independent of import order

    def __len__(self) -> int:
        self._load_all()
        return len(self._entries)


def discover(package: Any, *, recursive: bool = False) -> None:
    """Imports every module of `package` (each registers what it defines). Sub-packages are
    entered only when `recursive`, so one with optional dependencies can stay unimported."""
    walk = pkgutil.walk_packages if recursive else pkgutil.iter_modules
    for module in walk(package.__path__, f"{package.__name__}."):
        importlib.import_module(module.name)
