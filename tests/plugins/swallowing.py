"""A model builder that swallows the stop signal it sends itself, as C code that clears the Python
error it meets does (a SIGTERM landing in torch._C's initialisation once trained a run to its end,
exit 0). Loaded by the real CLI as `swallowing:mlp` (tests put this folder on PYTHONPATH)."""

import os
import signal

from scaletrain.models.mlp import MLP

_SENT = []


def mlp(shape, classes, signal_name="SIGTERM", **options):
    if not _SENT:
        _SENT.append(True)
        try:
            os.kill(os.getpid(), getattr(signal, signal_name))
            for _ in range(1000):      # the handler runs at a line in here, and its stop is lost
                pass
        except BaseException:           # noqa: BLE001 - the point: what C code does to a Python error
            pass
    return MLP(shape, classes, **options)
