"""Confirming the finalists: the given configuration and the best few measured again, interleaved
round by round (training/rounds.py holds the rule), so that a change in the machine's load cannot pick the
winner. The given configuration runs twice a round (its noise floor); a finalist wins only if it
beat the given configuration in every round and by more than that floor, else it is a tie and the
given configuration stays. Under time to target the rounds are seeds, and a finalist that loses
test accuracy beyond --test-tolerance is refused however fast it got there."""

from __future__ import annotations

import json
import statistics

from scaletrain.errors import PRUNED_EXIT_CODE
from scaletrain.experiments.autotune.measuring import CandidateRuns
from scaletrain.experiments.autotune.settings import TIME_TO_TARGET, Row, measuring_config, row_key
from scaletrain.experiments.jobs import settle, training_job
from scaletrain.experiments.pruning import TRIAL_ENV, rate_below_floor
from scaletrain.experiments.slots import SlotPool
from scaletrain.tracking.store import RunStore
from scaletrain.training.preflight import run_task
from scaletrain.training.rounds import AGAIN, MIN_ROUNDS_BEYOND_NOISE, WINDOW_S, Measured, confirm, window_steps


def confirm_finalists(runs: CandidateRuns, rows: dict[str, Row], given_key: str, pool: SlotPool, store: RunStore,
                      sample: tuple) -> list[float]:
    """Each finalist's row gets its paired advantage over the given configuration (`confirmed`)
    and whether it won; returns the noise floor's ratios (the given configuration against itself;
    empty where none was measured). `sample`: the data's (shape, outputs, task, example)."""
    s, base, console = runs.s, runs.base, runs.console
    if given_key not in rows or rows[given_key].outcome != "measured":
        return []
    better = s.objective.direction == "maximize"
    ranked = sorted((r for k, r in rows.items() if k != given_key and r.outcome == "measured" and r.value),
                    key=lambda r: r.value, reverse=better)[:s.finalists]
    if not ranked:
        return []
    # confirm-R-0: the given one; its second run each round is the noise floor (confirm.AGAIN).
    by_key = {given_key: rows[given_key]} | {row_key(r.params): r for r in ranked} | {AGAIN: rows[given_key]}
    seeded = s.objective is TIME_TO_TARGET
    window = (f" (seeds {base.seed}..{base.seed + s.confirm_rounds - 1})" if seeded else
              f", each {s.steps} steps x {s.epochs} epochs or about {WINDOW_S:g} s of measured steps "
              f"where that is fewer")
    console.print(f"confirming: the given configuration (twice a round: the noise floor) and "
                  f"{len(ranked)} finalist(s), {s.confirm_rounds} interleaved rounds{window}", soft_wrap=True)
    metric = base.target_metric
    higher = run_task(base, sample).metrics.get(metric, True) if seeded else True

    # Each contestant's last measured samples/s sizes its next window (confirm.window_steps):
    # a slow one is confirmed over about WINDOW_S, not minutes; its ratio is samples/s all the same.
    latest = {key: row.images_per_sec for key, row in by_key.items()}

    def measure(key: str, number: int) -> Measured | None:
        params = runs.configure(by_key[key].params)
        steps = None if seeded else window_steps(latest[key], params.batch_size, s.steps, s.epochs - 1)
        cfg = measuring_config(params, s, runs.train_samples, steps)
        if seeded:     # the whole training proved over seeds, not over one seed's luck
            cfg.seed = base.seed + number
        # A run that falls below the fastest contestant's speed / --prune-factor (the given
        # configuration's two threads on a loaded machine: a minute where it took 8 s a round
        # before) is stopped there, and the speed it trained at is its figure for the round.
        fastest = max((v for v in latest.values() if v), default=None)
        floor = None if seeded or fastest is None or base.distributed.nproc > 1 else fastest / s.prune_factor
        job = training_job(cfg, f"confirm-{number}-{list(by_key).index(key)}", s.out / "trials", runs.group,
                           env={TRIAL_ENV: json.dumps({"floor": {"samples_per_s": floor}})} if floor else None)
        finished = runs.wait(job, pool, store)
        if finished is None:
            return None
        record = settle(store, finished)
        if finished.returncode == PRUNED_EXIT_CODE:
            rate = rate_below_floor(finished.last_lines(1))
            if rate is None:
                return None
            latest[key] = rate
            return Measured(rate)
        value = s.objective.value(record) if record.status == "finished" else None
        if value is None:
            return None
        latest[key] = record.summary_value("images_per_sec") or latest[key]
        test = (record.summary_value("test_metrics") or {}).get(metric) if seeded else None
        return Measured(value, None if test is None else (test if higher else -test))

    found = confirm(given_key, [k for k in by_key if k not in (given_key, AGAIN)], s.confirm_rounds, measure,
                    (lambda v, b: v / b) if better else (lambda v, b: b / v), runs.deadline,
                    test_tolerance=s.test_tolerance if seeded else None)
    noise = next(iter(found.values())).noise
    if noise is not None and noise.ratios:
        band = next(iter(found.values())).band
        console.print(f"  noise floor: the given configuration against itself {noise.describe()}, noise "
                      f"±{band:.0%}; a finalist must beat it by more than that in {MIN_ROUNDS_BEYOND_NOISE} "
                      "rounds to win", soft_wrap=True)
    for key, confirmation in found.items():
        row = by_key[key]
        row.confirmed, row.wins = confirmation.ratios, confirmation.wins
        if confirmation.test_deltas:
            row.test_delta = statistics.median(confirmation.test_deltas) * (1 if higher else -1)
        if confirmation.loses_test:
            row.outcome = "refused"
            row.why = (f"test {metric} {row.test_delta:+.4f} against the given configuration (median over "
                       f"{len(confirmation.test_deltas)} seeds; --test-tolerance {s.test_tolerance:g})")
        if confirmation.ratios:
            verdict = ("" if confirmation.wins else ": refused, " + row.why if confirmation.loses_test
                       else ": slower in every round" if confirmation.slower
                       else f": a tie, inconclusive (beyond the noise floor in {confirmation.rounds_beyond_noise} of "
                            f"{len(confirmation.ratios)} rounds, {MIN_ROUNDS_BEYOND_NOISE} needed)")
            console.print(f"  {', '.join(f'{k.label}={row.params[k.key]}' for k in runs.knobs)}: "
                          f"{confirmation.describe()} against the given configuration{verdict}", soft_wrap=True)
    return list(noise.ratios) if noise is not None and noise.ratios else []
