"""The console the commands print tables to (see scaletrain/console.py)."""

from scaletrain.console import make_console, wide_console

__all__ = ["make_console", "wide_console"]
