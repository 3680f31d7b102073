"""A training run's lifecycle: its folder, id, lock, saved config, resume decision and status.

One owner (`Run`, started by `start_run`) for everything a run writes, so a new training never
reuses an old run's id, metrics or checkpoints, two trainings never share a folder, and a resume
continues exactly the run it names with the configuration that run was started with.
"""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "RUNS_ROOT": "scaletrain.lifecycle.plan",
    "checkpoint_store": "scaletrain.lifecycle.plan",
    "make_checkpointer": "scaletrain.lifecycle.plan",
    "resume_source": "scaletrain.lifecycle.plan",
    "run_name": "scaletrain.lifecycle.plan",
    "FolderLock": "scaletrain.lifecycle.lock",
    "Run": "scaletrain.lifecycle.run",
    "RunRequest": "scaletrain.lifecycle.run",
    "TakenFolder": "scaletrain.lifecycle.plan",
    "RunFolder": "scaletrain.lifecycle.folder",
    "RunFolderBusy": "scaletrain.lifecycle.lock",
    "RunPlan": "scaletrain.lifecycle.plan",
    "check_new_output_dir": "scaletrain.lifecycle.paths",
    "check_writable_dir": "scaletrain.lifecycle.paths",
    "check_writable_file": "scaletrain.lifecycle.paths",
    "locked_differences": "scaletrain.lifecycle.resume",
    "plan_run": "scaletrain.lifecycle.plan",
    "resume_config": "scaletrain.lifecycle.resume",
    "settle_config": "scaletrain.lifecycle.run",
    "start_run": "scaletrain.lifecycle.run",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.lifecycle.folder import RunFolder
    from scaletrain.lifecycle.lock import FolderLock, RunFolderBusy
    from scaletrain.lifecycle.paths import check_new_output_dir, check_writable_dir, check_writable_file
    from scaletrain.lifecycle.plan import (
        RUNS_ROOT,
        RunPlan,
        TakenFolder,
        checkpoint_store,
        make_checkpointer,
        plan_run,
        resume_source,
        run_name,
    )
    from scaletrain.lifecycle.resume import locked_differences, resume_config
    from scaletrain.lifecycle.run import Run, RunRequest, settle_config, start_run
