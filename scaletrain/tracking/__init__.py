"""Recording runs: the SQLite run store, the environment and system samples of each run, and
optional TensorBoard event files."""

from scaletrain.tracking.store import DEFAULT_STORE, RunRecord, RunStore, Sample, new_run_id

__all__ = ["DEFAULT_STORE", "RunRecord", "RunStore", "Sample", "new_run_id"]
