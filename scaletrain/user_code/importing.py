"""A user's own function named `package.module:function` (a model builder, a data set, a task):
imported from the working directory or PYTHONPATH, once a process (every later question about the
same name gets the same object), its failures worded as one line for the command line."""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable

from scaletrain.errors import ConfigError

# `package.module:function`: what `--model` and `--data` take beside the registered names.
FUNCTION_NAME = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def cwd_importable() -> None:
    """The working directory first on the import path, as `python -m` puts it, so `--model
    mymodels:build` finds ./mymodels.py without PYTHONPATH=. (the console script leaves it out)."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)


_IMPORTED: dict[str, Callable] = {}


def import_function(name: str, kind: str) -> Callable:
    """The function `name` (`package.module:function`) names; `kind` words the errors ("model")."""
    if name not in _IMPORTED:
        _IMPORTED[name] = _import(name, kind)
    return _IMPORTED[name]


def _import(name: str, kind: str) -> Callable:
    if not FUNCTION_NAME.fullmatch(name):
        raise ConfigError(f"{kind} '{name}': expected package.module:function")
    module_name, _, attr = name.partition(":")
    cwd_importable()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{kind} '{name}': cannot import module '{module_name}' ({exc}); run from the folder "
                          "that holds it, or add that folder to PYTHONPATH") from None
    except Exception as exc:   # the module itself failed: its message, not our traceback
        raise ConfigError(f"{kind} '{name}': importing '{module_name}' failed: {type(exc).__name__}: {exc}") from None
    except SystemExit as exc:   # a script's exit at import (argparse, sys.exit): our command would end silently
        raise ConfigError(f"{kind} '{name}': importing '{module_name}' called sys.exit({exc.code!r}); put the "
                          "module's script code under `if __name__ == \"__main__\":`") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise ConfigError(f"{kind} '{name}': module '{module_name}' has no function '{attr}'")
    return function
