"""Package re-exports imported on first use (PEP 562), so that importing one light module of a
package (the run store, the config, a path check) does not import its heavy siblings, and the
commands that only read (`--help`, `list`, `runs`) answer without importing torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose public `exports` map each name to the
    module that defines it (for a registry: the module that fills it)."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value            # looked up once
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
