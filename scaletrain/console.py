"""The consoles scaletrain prints through. Markup is off: run ids, groups, paths and error texts
come from users, and rich would read `[/]` or `[bold]` in them as markup (a group named '[/]'
once made `runs list` raise for the whole store). Styling is explicit, through rich.text.Text."""

from __future__ import annotations

import sys

from rich.console import Console


def make_console(**kwargs) -> Console:
    return Console(markup=False, **kwargs)


def wide_console() -> Console:
    """A terminal's own width; piped or redirected output keeps whole rows (rich would fold
    tables to 80 columns)."""
    return make_console() if sys.stdout.isatty() else make_console(width=200)
