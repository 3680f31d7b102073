"""Whether --budget-s holds one candidate, said before anything runs (issue 95: with --budget-s 120
on a machine at load 16 autotune measured nothing, then exited 1).

Every candidate is a process of its own that starts, builds and trains the measured window; the
given configuration is measured first. So before the study opens, a few of the given
configuration's steps are timed here, in this process (the probe's Arm: training/probe.py), and
with this process's own start-up they predict what measuring it will take. A budget short of that
is refused in one line that says what would hold it; the pilot's seconds count in the budget.
"""

from __future__ import annotations

import math
import time

from scaletrain.errors import UserError
from scaletrain.experiments.autotune.settings import TIME_TO_TARGET, AutotuneSettings, measuring_config

PILOT_WARMUP_STEPS, PILOT_STEPS = 2, 3


def process_age_s() -> float:
    """Seconds since this process started: what starting a candidate's process costs here
    (the interpreter, torch and scaletrain imported, the data read)."""
    import psutil
    return max(time.time() - psutil.Process().create_time(), 0.0)


def predicted_candidate_s(base, s: AutotuneSettings, dataset) -> tuple[float, int, float, float]:
    """(seconds, steps, seconds a step, start-up seconds) the given configuration's measuring run
    is predicted to take: its steps (the measured window's, or one epoch under time to target, the
    least it trains) at the step time of a few steps timed now, and a process's start-up."""
    from scaletrain.training.build import build_training
    from scaletrain.training.probe import Arm
    startup = process_age_s()
    cfg = measuring_config(base, s, len(dataset.train))
    cfg.tracking.record, cfg.progress = False, False
    arm = Arm(build_training(cfg, dataset=dataset).trainer, dataset)
    try:
        arm.window(PILOT_WARMUP_STEPS)
        seconds, _ = arm.window(PILOT_STEPS)
    finally:
        arm.close()
    step_s = seconds / PILOT_STEPS
    steps = arm.steps_per_epoch if s.objective is TIME_TO_TARGET else s.steps * s.epochs
    return startup + steps * step_s, steps, step_s, startup


def check_budget_holds_one(base, s: AutotuneSettings, dataset, deadline: float | None) -> None:
    """Raises a UserError where the rest of --budget-s cannot hold the given configuration's own
    measuring run. A search under several processes (--nproc) is not predicted by one here."""
    if deadline is None or base.distributed.nproc > 1:
        return
    predicted, steps, step_s, startup = predicted_candidate_s(base, s, dataset)
    left = deadline - time.perf_counter()
    if predicted <= left:
        return
    enough = math.ceil(3 * predicted / 10) * 10     # the given configuration and two candidates, at the least
    raise UserError(f"--budget-s {s.budget_s:g} cannot hold one candidate: measuring the given configuration is "
                    f"predicted to take {predicted:.0f} s here ({steps} steps at {step_s * 1000:.0f} ms, timed just "
                    f"now, and {startup:.0f} s to start its process), {left:.0f} s are left; give --budget-s {enough} "
                    "or more, or fewer --steps")
