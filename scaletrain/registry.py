"""Name registries filled by class decorators: one per pluggable concept (strategies, tasks)."""

from __future__ import annotations

from typing import Callable


def registrar(table: dict[str, type], flag: str) -> Callable[[str], Callable[[type], type]]:
    """A decorator factory: `@register("name")` sets the class's `name` and adds it to `table`,
    which makes it available as `flag NAME`."""
    def register(name: str) -> Callable[[type], type]:
        def add(cls: type) -> type:
            cls.name = name
            table[name] = cls
            return cls
        return add
    register.__doc__ = f"Class decorator: makes a class available as `{flag} NAME`."
    return register
