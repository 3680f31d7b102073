"""Measuring one candidate: its own `scaletrain train` process for a short window, bounded by
--budget-s and by --cap-factor times the baseline's run, judged against the baseline.

Every candidate trains the same seeded steps, the first epoch a warm-up (compilation included)
that is timed apart and never enters images/sec. One whose images/sec trails the median of earlier
ones after its warm-up, or falls below the best so far / --prune-factor within an epoch, is
pruned. A finished one's per-epoch training loss is compared with the baseline's; one that departs
beyond the tolerance (looser where the precision changes the arithmetic) is refused.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

from rich.console import Console

from scaletrain.config import TrainConfig
from scaletrain.errors import PRUNED_EXIT_CODE
from scaletrain.experiments.autotune.knobs import Knob
from scaletrain.experiments.autotune.settings import THROUGHPUT, TIME_TO_TARGET, AutotuneSettings, Row, measuring_config
from scaletrain.experiments.jobs import settle, training_job
from scaletrain.experiments.pruning import TRIAL_ENV, rate_below_floor
from scaletrain.experiments.slots import Finished, SlotPool
from scaletrain.tracking.store import RunStore
from scaletrain.training.rounds import loss_departure, within_tolerance


class CandidateRuns:
    """Runs candidates one at a time (each alone on the machine, so none is timed beside another)
    and keeps what bounds the next: the baseline's whole run (the cap), every finished run's
    length (what a confirmation run costs) and whether --budget-s ran out."""

    def __init__(self, base: TrainConfig, settings: AutotuneSettings, console: Console,
                 configure: Callable[[dict], TrainConfig], knobs: list[Knob], train_samples: int, group: str,
                 storage_url: str, deadline: float | None):
        self.base, self.s, self.console, self.configure = base, settings, console, configure
        self.knobs, self.train_samples, self.group = knobs, train_samples, group
        self.storage_url, self.deadline = storage_url, deadline
        self.budget_ran_out = False
        self.baseline_s: float | None = None   # the baseline's whole run, in seconds: what caps the others
        self.run_seconds: list[float] = []     # every finished candidate's whole run

    def wait(self, job, pool: SlotPool, store: RunStore) -> Finished | None:
        """Starts `job` and waits for it until --budget-s runs out or it outruns its cap (then it
        is stopped, settled in the store as such, and None returned)."""
        pool.start(job)
        started = time.perf_counter()
        cap = started + self.s.cap_factor * self.baseline_s if self.baseline_s is not None else None
        finished = pool.wait_any(until=min((t for t in (self.deadline, cap) if t is not None), default=None))
        if finished is None:
            pool.terminate()
            settle(store, Finished(job, None, -15, time.perf_counter() - started))
        return finished

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def floor(self, rows: dict[str, Row]) -> float | None:
        """The speed below which a candidate is stopped within an epoch: the best accepted
        samples/s so far over --prune-factor (0 before any: the baseline carries the same callback,
        so every candidate is timed alike). None where nothing is pruned (the grid, time to target)
        or the processes would have to agree at every step (--nproc)."""
        if self.s.exhaustive or self.s.objective is not THROUGHPUT or self.base.distributed.nproc > 1:
            return None
        best = max((r.images_per_sec for r in rows.values() if r.outcome == "measured" and r.images_per_sec),
                   default=None)
        return 0.0 if best is None else best / self.s.prune_factor

    def confirmation_reserve(self, rows: dict[str, Row], given_key: str) -> float | None:
        """Under --budget-s, the seconds the confirmation will take once a finalist is measured:
        its runs (rounds x the given configuration and the finalists) at the median whole run of
        the candidates so far, so that a search bounded by the budget still ends confirmed."""
        if self.deadline is None or not self.s.confirm_rounds or not self.run_seconds:
            return None
        given = rows.get(given_key)
        others = sum(1 for r in rows.values() if r.outcome == "measured" and r is not given)
        if given is None or given.outcome != "measured" or not others:
            return None
        return self.s.confirm_rounds * (1 + min(self.s.finalists, others)) * statistics.median(self.run_seconds)

    def candidate(self, trial, params: dict, pool: SlotPool, store: RunStore, baseline: Row | None,
                  floor: float | None = None) -> Row:
        """Measures the candidate `params` as Optuna's `trial`; `baseline`: the given
        configuration's row (None while it is the one measured)."""
        cfg = measuring_config(self.configure(params), self.s, self.train_samples)
        name = f"trial-{trial.number:04d}"
        spec = {"storage": self.storage_url, "study": self.s.study_name, "trial_id": trial._trial_id,
                "metric": "images_per_sec",
                # The grid measures every candidate whole: it is the reference the search is judged by.
                # Time to target stops each candidate at its own target: nothing to prune on.
                "pruner": {"kind": "none"} if self.s.exhaustive or self.s.objective is TIME_TO_TARGET else
                {"kind": "median", "startup_trials": 2, "warmup_epochs": 1},
                "floor": None if floor is None else {"samples_per_s": floor}}
        job = training_job(cfg, name, self.s.out / "trials", self.group, payload=trial.number,
                           env={TRIAL_ENV: json.dumps(spec)})
        run_id = job.payload[0].tracking.run_id
        shown = ", ".join(f"{k.label}={params[k.key]}" for k in self.knobs)
        self.console.print(f"trial {trial.number}: {shown} ...", soft_wrap=True)
        finished = self.wait(job, pool, store)
        if finished is None:   # --budget-s ran out, or the candidate outran its cap, while it ran
            if self.past_deadline():
                self.budget_ran_out = True
                why = f"the --budget-s of {self.s.budget_s:g} s ran out while it ran"
            else:
                why = (f"ran past {self.s.cap_factor:g}x the baseline's {self.baseline_s:.0f} s "
                       f"(--cap-factor): stopped as hopeless")
            self.console.print(f"  stopped: {why}")
            return Row(params, "stopped", why=why, run_id=run_id, trial=trial.number)
        if baseline is None and finished.returncode == 0:
            self.baseline_s = finished.seconds   # the given configuration, measured first
        if finished.returncode == 0:
            self.run_seconds.append(finished.seconds)
        if finished.returncode == PRUNED_EXIT_CODE:
            below_floor = rate_below_floor(finished.last_lines(1)) is not None
            why = (f"{finished.last_lines(1).split(': ', 1)[-1]} (the best so far / --prune-factor "
                   f"{self.s.prune_factor:g})" if below_floor else "images/sec below the median of earlier candidates")
            self.console.print(f"  pruned: {why} ({finished.seconds:.1f} s)", soft_wrap=True)
            return Row(params, "pruned", why=why, run_id=run_id, trial=trial.number)
        record = settle(store, finished)
        if record.status != "finished":
            why = (record.error or f"exit code {finished.returncode}").strip().splitlines()[-1][:160]
            self.console.print(f"  failed: {why}", soft_wrap=True)
            return Row(params, "failed", why=why, run_id=run_id, trial=trial.number)
        epochs = store.epochs(record.id)
        value = self.s.objective.value(record)
        if value is None:
            why = f"did not reach {cfg.target_metric} {cfg.target} in {cfg.epochs} epochs"
            self.console.print(f"  failed: {why}")
            return Row(params, "failed", why=why, run_id=run_id, trial=trial.number,
                       images_per_sec=record.summary_value("images_per_sec"))
        row = Row(params, "measured", value=float(value), images_per_sec=record.summary_value("images_per_sec"),
                  peak_memory_bytes=record.summary_value("peak_memory_bytes"),
                  warmup_s=record.summary_value("warmup_s"),
                  loss=[float(e["train_loss"]) for e in epochs if e.get("train_loss") is not None],
                  run_id=run_id, trial=trial.number)
        # The loss check compares the same seeded steps; time to target trains other batch sizes,
        # whose proof is reaching the target on the validation split.
        if self.s.objective is THROUGHPUT and baseline is not None and baseline.loss:
            self.check_loss(row, baseline)
        note = f", loss departs {row.departure:.2%}" if row.departure is not None else ""
        reached = f", {row.value:.2f} s to target" if self.s.objective is TIME_TO_TARGET else ""
        self.console.print(f"  {row.outcome}: {row.images_per_sec:,.0f} samples/s{reached}, warm-up "
                           f"{row.warmup_s:.1f} s{note}{' -- ' + row.why if row.why else ''}", soft_wrap=True)
        return row

    def check_all(self, rows: dict[str, Row], given_key: str) -> None:
        """Every measured candidate's loss against the given configuration's, whenever each was
        measured: a search resumed after the given configuration's run was cut short measured some
        before it (issue 66: they had gone unchecked, `departure: null`). The losses compared are
        the ones stored with the study (each trial's row)."""
        given = rows.get(given_key)
        if self.s.objective is not THROUGHPUT or given is None or given.outcome != "measured" or not given.loss:
            return
        for key, row in rows.items():
            if key != given_key and row.outcome == "measured" and row.departure is None:
                self.check_loss(row, given)

    def tolerance(self, params: dict) -> float:
        numerics = any(k.numerics and params[k.key] != k.values[0] for k in self.knobs)
        return self.s.loss_tolerance_16bit if numerics else self.s.loss_tolerance

    def check_loss(self, row: Row, baseline: Row) -> None:
        row.departure = loss_departure(row.loss, baseline.loss)
        tol = self.tolerance(row.params)
        if not within_tolerance(row.departure, tol):
            row.outcome = "refused"
            row.why = f"loss departs {row.departure:.2%} from the baseline's (tolerance {tol:.0%})"

