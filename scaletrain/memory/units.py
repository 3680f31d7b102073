"""Byte sizes as people write them: 80GB, 80 GiB, 512MiB, 1.5e9."""

from __future__ import annotations

import re

from scaletrain.errors import ConfigError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, what: str = "memory size") -> int:
    """'80GB' -> 80e9, '80GiB' -> 80 * 2**30, '1.5e9' -> 1.5e9 bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if not match or match.group(2) not in _UNITS:
        raise ConfigError(f"cannot read {what} '{text}'; write a number with an optional unit, e.g. 80GB, "
                          "80GiB, 512MiB")
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if value <= 0:
        raise ConfigError(f"{what} '{text}' must be positive")
    return int(value)


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
