"""The console the commands print tables to."""

from __future__ import annotations

import sys

from rich.console import Console


def wide_console() -> Console:
    """A terminal's own width; piped or redirected output keeps whole rows (rich would fold
    tables to 80 columns)."""
    return Console() if sys.stdout.isatty() else Console(width=200)
