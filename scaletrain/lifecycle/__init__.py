"""A training run's lifecycle: its folder, id, lock, saved config, resume decision and status.

One owner (`Run`, built by `open_run`) for everything a run writes, so a new training never
reuses an old run's id, metrics or checkpoints, two trainings never share a folder, and a resume
continues exactly the run it names with the configuration that run was started with.
"""

from scaletrain.lifecycle.folder import RunFolder
from scaletrain.lifecycle.lock import FolderLock, RunFolderBusy
from scaletrain.lifecycle.paths import check_new_output_dir, check_writable_dir, check_writable_file
from scaletrain.lifecycle.resume import locked_differences, resume_config
from scaletrain.lifecycle.run import RUNS_ROOT, Run, RunPlan, checkpoint_store, make_checkpointer, open_run, plan_run, resume_source, run_name

__all__ = ["RUNS_ROOT", "checkpoint_store", "make_checkpointer", "resume_source", "run_name", "FolderLock", "Run", "RunFolder", "RunFolderBusy", "RunPlan", "check_new_output_dir", "check_writable_dir",
           "check_writable_file", "locked_differences", "open_run", "plan_run", "resume_config"]
