"""The consoles scaletrain prints through. Markup is off: run ids, groups, paths and error texts
come from users, and rich would read `[/]` or `[bold]` in them as markup (a group named '[/]'
once made `runs list` raise for the whole store). Styling is explicit, through rich.text.Text."""

from __future__ import annotations

import contextlib
import logging
import sys

from rich.console import Console

# torch's fake-tensor logger prints a whole traceback (`log.exception`) when an op fails on fake
# tensors, before the exception reaches whoever traced: the planner and the probes word that
# failure themselves, in one line (35 lines of it once came before autotune's).
FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"


def make_console(**kwargs) -> Console:
    return Console(markup=False, **kwargs)


def wide_console() -> Console:
    """A terminal's own width; piped or redirected output keeps whole rows (rich would fold
    tables to 80 columns)."""
    return make_console() if sys.stdout.isatty() else make_console(width=200)


@contextlib.contextmanager
def quiet_fake_tensors():
    """Inside: torch's fake-tensor logger says nothing (its failures are raised, and worded, here)."""
    logger = logging.getLogger(FAKE_TENSOR_LOGGER)
    before = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(before)
