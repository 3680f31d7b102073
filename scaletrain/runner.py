"""One run end to end, on every rank: start (lifecycle/run.py) -> build -> fit -> finish. The
chief decides the run's folder and configuration and tells the others; only it prints and
writes run files. `launch_training` starts the processes of a multi-process run and records a
job that did not finish.

The CLI calls these; so can a notebook or a sweep (`run_training(cfg)`).
"""

from __future__ import annotations

from rich.console import Console

from scaletrain.config import TrainConfig
from scaletrain.console import make_console
from scaletrain.distributed import build_strategy, dist_env
from scaletrain.distributed.capabilities import Serving
from scaletrain.errors import INTERRUPTED_EXIT_CODE, TERMINATED_EXIT_CODE, UserError
from scaletrain.files import keep_compiled_artifacts
from scaletrain.lifecycle.run import RunRequest, settle_config, start_run
from scaletrain.summary import RunSummary
from scaletrain.training import Trainer, build_training


def run_training(cfg: TrainConfig | RunRequest, console: Console | None = None,
                 callbacks=()) -> tuple[RunSummary | None, Trainer | None]:
    """Trains one run. `cfg`: a configuration (settled here) or one the caller settled
    (`settle_config`). `callbacks`: extra callbacks, on every rank (a tuner's pruning callback,
    whose stop every rank must take: it asks the chief and follows its answer).
    A process that serves rather than trains (a parameter server) returns (None, None)."""
    keep_compiled_artifacts()     # (a no-op after the CLI's; first for the Python API)
    env = dist_env()
    request = cfg if isinstance(cfg, RunRequest) else settle_config(cfg, env)
    strategy = build_strategy(request.config.distributed, env)
    try:
        strategy.setup(request.config.device)
        if strategy.layout.serves:   # a parameter server: it serves the workers until they are done
            assert isinstance(strategy, Serving), f"strategy {strategy.name} lays out servers but cannot serve"
            strategy.serve(request.config.optim)
            strategy.teardown()
            return None, None
        console = console or make_console()
        if not strategy.is_chief:
            console = make_console(quiet=True)
        run = start_run(request, env, strategy, console, callbacks)
        with run:
            trainer = build_training(run.config, strategy=strategy, dataset=run.dataset, task=run.task,
                                     callbacks=run.callbacks, checkpointer=run.checkpointer, checked=True).trainer
            run.announce(trainer)
            run.reserve(trainer)
            trainer.fit(run.dataset)
            if trainer.resumed_from:
                console.print(f"resumed from {trainer.resumed_from}", soft_wrap=True)
            summary = run.finish(trainer)
    except BaseException:
        strategy.teardown(clean=False)  # a peer may be dead or hung: no draining barrier
        raise
    strategy.teardown()
    return summary, trainer


def launch_training(request: RunRequest, argv: list[str], hosts: int = 1) -> int:
    """Starts `--nproc` processes on this host (of `hosts`) for the run `request` describes, after
    everything its workers would refuse was refused here in one line; each worker continues the
    run planned here. Returns the job's exit code; a job that did not finish is recorded so."""
    from scaletrain.distributed.launch import launch_from_config
    from scaletrain.lifecycle.plan import make_checkpointer, plan_run, record_job_end
    from scaletrain.training.preflight import preflight
    cfg, env = request.config, dist_env()
    plan = plan_run(cfg, env, request.undecided(), request.unnamed)
    layout = preflight(cfg, cfg.distributed.nproc * hosts, make_checkpointer(plan, cfg, env))
    code = launch_from_config(cfg, layout, list(argv), str(plan.folder.path), plan.run_id)
    if code == 0 and not _recorded_finished(plan, hosts):
        from scaletrain.distributed.env import scaletrain_command
        command = " ".join(scaletrain_command())
        record_job_end(plan, cfg, "failed", f"the workers exited 0 without training ({command})")
        raise UserError(f"the job's workers exited 0, but none recorded run {plan.run_id} finished in "
                        f"{plan.folder.path}: their command `{command}` did not train (SCALETRAIN_CHILD_COMMAND "
                        "must run scaletrain with its arguments; unset it to run `python -m scaletrain`)")
    if code != 0:
        stopped = code in (INTERRUPTED_EXIT_CODE, TERMINATED_EXIT_CODE)
        record_job_end(plan, cfg, "interrupted" if stopped else "failed",
                       None if stopped else f"a worker failed with exit code {code}")
    return code


def _recorded_finished(plan, hosts: int) -> bool:
    """Whether the job's chief recorded the run finished: the proof that its workers trained (a
    child command that is not scaletrain exits 0 having done nothing). On a host of a multi-host
    job that does not hold the chief the folder is not this host's to read: taken as said."""
    from scaletrain.distributed.cluster import cluster_from_env
    spec = cluster_from_env() if hosts > 1 else None
    if spec is not None and spec.rank != 0:
        return True
    folder = plan.folder
    return folder.holds_run() and folder.run_id == plan.run_id and folder.status == "finished"
