"""The commands' own numeric flags, checked as config fields are: each declares its bounds beside
it (a config `Check`), and a value out of range, not finite or not a number is one line naming the
flag and the rule, exit 2, while the arguments are parsed, before any work starts."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from scaletrain.errors import ConfigError
from scaletrain.options import Check


def number(flag: str, kind: type, check: Check) -> Callable[[str], int | float]:
    """An argparse `type` reading `kind` (int or float) and refusing what `check` refuses."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise ConfigError(f"{flag} must be {'a whole number' if kind is int else 'a number'} "
                              f"(got {text!r})") from None
        problem = check.problem(value)
        if problem:
            raise ConfigError(f"{flag} {problem} (got {text})")
        return value
    return parse


def add_number(group, flag: str, kind: type, *, ge=None, gt=None, le=None, lt=None, **kwargs) -> argparse.Action:
    """`group.add_argument(flag, ...)` for a number within the given bounds."""
    return group.add_argument(flag, type=number(flag, kind, Check(ge=ge, gt=gt, le=le, lt=lt)), **kwargs)


def add_trust_code(parser: argparse.ArgumentParser) -> None:
    """--trust-code, for a command that imports the code a saved run names (user_code/trust.py)."""
    parser.add_argument("--trust-code", action="store_true",
                        help="import the package.module:name code a run folder or run store names even where "
                             "this machine did not write the run (a folder copied from elsewhere): importing "
                             "runs code, so only for folders you trust (also SCALETRAIN_TRUST_CODE=1)")
