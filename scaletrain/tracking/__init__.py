"""Recording runs: the SQLite run store, the environment and system samples of each run, and
the trackers a run also logs to (loggers/: MLflow, W&B, TensorBoard)."""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "DEFAULT_STORE": "scaletrain.tracking.store",
    "RunRecord": "scaletrain.tracking.store",
    "RunStore": "scaletrain.tracking.store",
    "Sample": "scaletrain.tracking.store",
    "new_run_id": "scaletrain.tracking.store",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.tracking.store import DEFAULT_STORE, RunRecord, RunStore, Sample, new_run_id
