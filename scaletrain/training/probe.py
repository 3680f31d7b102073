"""The precision a run with `--precision auto` trains in, measured on its own step (issue 95).

A rule cannot know the user's model: on a CPU with AVX512-BF16 bf16-mixed ran the default recipe
1.86x faster than fp32, on an Intel Xeon with AMX 0.82x. So before training, where the run is
long enough to pay for it, each precision this device computes natively trains a few steps of
the run's own model, data and batch, on copies built from the same seed (the run itself is built
afterwards, exactly as if its precision had been named). The arms take turns window by window,
round by round, and the reference (the rule's choice) runs twice, as two copies, so every round
measures the noise: how far two runs of one setting read apart on this machine now.

A candidate is chosen only where it beat the reference by more than that noise in at least
MIN_ROUNDS rounds (the rule of training/rounds.py, autotune's too) and its training loss stayed within autotune's
tolerance of the reference's over the same steps; otherwise the reference is kept and the start
line says why ("inconclusive": the noise, the load). The probe costs at most `probe_share` of the
run's predicted time (PROBE_CAP_S at most), counted from the reference's first copy on (whose
build and first step pay the process's one-time costs the run would pay anyway): a run whose step
count alone says it is too short is not probed at all; one whose measured step says so stops
after the reference's two copies. A decision is kept in the user's cache
folder (cache.py) under the model's structure, input, batch, device, threads and torch version,
so the next run of the same model starts at once.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from scaletrain.errors import UserError
from scaletrain.files import read_json, user_cache_dir
from scaletrain.inputs import tensors
from scaletrain.precision.hardware import CPU_BF16_FLAGS, NATIVE_BF16, DeviceFacts
from scaletrain.training.defaults import Setting
from scaletrain.training.rounds import (
    AGAIN,
    LOSS_TOLERANCE,
    LOSS_TOLERANCE_16BIT,
    Confirmation,
    Measured,
    confirm,
    loss_departure,
    within_tolerance,
)

PROBE_CAP_S = 60.0
# Rounds: at least MIN_ROUNDS (the rule asks for that many beyond the noise), up to MAX_ROUNDS
# where the budget allows; a window is at least MIN_WINDOW_STEPS steps.
MIN_ROUNDS, MAX_ROUNDS = 3, 5
MIN_WINDOW_STEPS = 2
WARMUP_STEPS = 2      # per arm, untimed: allocation and kernel selection (the second one times the reference)
MAX_WINDOW_STEPS = 50
MAX_ARM_STEPS = WARMUP_STEPS + MAX_ROUNDS * MAX_WINDOW_STEPS


def precision_candidates(facts: DeviceFacts, reference: str) -> list[str]:
    """The precisions besides `reference` (the rule's) that can pay on this device: bf16-mixed where
    it computes bfloat16 natively (AVX512-BF16 or AMX on a CPU; compute capability 8.0 on CUDA),
    fp16-mixed on CUDA's tensor cores, and fp32."""
    if facts.kind not in ("cpu", "cuda"):    # an XLA device compiles each shape: a few steps measure its compiler
        return []
    native_bf16 = ((facts.kind == "cpu" and bool(facts.cpu_flags & CPU_BF16_FLAGS))
                   or (facts.kind == "cuda" and facts.capability is not None and facts.capability >= NATIVE_BF16))
    names = ["fp32", *(["bf16-mixed"] if native_bf16 else []), *(["fp16-mixed"] if facts.kind == "cuda" else [])]
    return [n for n in names if n != reference]


@dataclass
class Decision:
    """What the probe chose, why (the start line's words) and its figures (the run's record)."""
    policy: str
    why: str
    figures: dict = field(default_factory=dict)
    seconds: float = 0.0         # what probing cost this run (0 for a cached or unprobed decision)

    @property
    def measured(self) -> bool:
        return bool(self.figures.get("rounds"))


def probe_cost_steps(arms: int, rounds: int = MIN_ROUNDS, window: int = MIN_WINDOW_STEPS) -> int:
    """Steps the smallest probe of `arms` arms trains (the reference's two copies among them)."""
    return arms * (WARMUP_STEPS + rounds * window)


def too_short(run_steps: int, arms: int, share: float) -> str | None:
    """Why a run of `run_steps` optimizer steps is not probed, decided before any step: the
    smallest probe takes more steps than `share` of the run's. None: it may be."""
    need = probe_cost_steps(arms)
    if need <= share * run_steps or share >= 1:    # 1: the user asks for a probe whatever the run's length
        return None
    return (f"not probed: {run_steps} steps are too few to repay a probe of {need} (over {share:.0%} of them; "
            "--probe-share 1 measures anyway)")


class Arm:
    """One candidate's copy of the run: its trainer, its batches (the run's, in the run's order) and
    its step. `window(k)` trains k steps and returns (seconds, mean loss)."""

    def __init__(self, trainer, dataset):
        self.trainer = trainer
        trainer.adopt(dataset)
        trainer.settle_for_data(dataset)
        self.loader = trainer.loader(dataset.train, train=True)
        self.steps_per_epoch = len(self.loader)
        trainer.counters.resize(self.steps_per_epoch)
        # A schedule long enough for the most steps a probe trains (a short run probed with
        # --probe-share 1 may have fewer steps than that): the same on every arm, which is all the
        # loss check compares.
        epochs = max(trainer.config.epochs, -(-MAX_ARM_STEPS // self.steps_per_epoch) + 1)
        self.step = trainer.build_step(trainer.schedule(self.steps_per_epoch, epochs))
        self.trainer.model.train()
        self._batches = iter(self.loader)

    def _next(self):
        try:
            return next(self._batches)
        except StopIteration:
            self._batches = iter(self.loader)
            return next(self._batches)

    def window(self, steps: int) -> tuple[float, float]:
        c = self.trainer.counters
        c.reset_epoch()
        steps = min(steps, self.steps_per_epoch)
        start = time.perf_counter()
        for _ in range(steps):
            x, y = self._next()
            self.step(x, y)
        losses = c.read(steps)["losses"]          # the host read: the device has finished
        seconds = time.perf_counter() - start
        return seconds, sum(losses) / len(losses)

    def close(self) -> None:
        self.loader.stop_workers()    # a user's DataLoader workers end with the copy, not at exit
        self.trainer.close()


def budget_s(predicted_s: float, share: float) -> float:
    return min(share * predicted_s, PROBE_CAP_S)


def plan_windows(step_s: float, arms: int, budget: float) -> tuple[int, int] | None:
    """(rounds, steps per window) that fit `budget` seconds at `step_s` a step, the most rounds
    first; None where even the smallest probe does not fit."""
    for rounds in range(MAX_ROUNDS, MIN_ROUNDS - 1, -1):
        window = int(budget / (step_s * arms * rounds))
        if window >= MIN_WINDOW_STEPS:
            return rounds, min(window, MAX_WINDOW_STEPS)
    return None


def tolerance(policy: str, reference: str) -> float:
    sixteen = any(p != "fp32" for p in (policy, reference))
    return LOSS_TOLERANCE_16BIT if sixteen else LOSS_TOLERANCE


def decide(reference: str, found: dict[str, Confirmation], losses: dict[str, list[float]]) -> tuple[str, str, dict]:
    """The policy chosen from each candidate's confirmation against the reference, and the start
    line's reason; a candidate must win (rounds.py: rounds beyond the noise) and keep its loss."""
    figures: dict = {"reference": reference, "candidates": {}}
    noise = next(iter(found.values())).noise if found else None
    band = next(iter(found.values())).band if found else 0.0    # every candidate's: the same floor
    figures["noise"] = {"ratios": list(noise.ratios) if noise else [], "band": band}
    best, best_why = None, []
    for name, conf in found.items():
        departure = loss_departure(losses.get(name, []), losses.get(reference, []))
        tol = tolerance(name, reference)
        figures["candidates"][name] = {"ratios": conf.ratios, "loss_departure": departure, "loss_tolerance": tol,
                                       "rounds_beyond_noise": conf.rounds_beyond_noise}
        rounds = len(conf.ratios)
        head = f"{name} {conf.median:.2f}x {reference} ({conf.low:.2f}-{conf.high:.2f})"
        if not within_tolerance(departure, tol):
            best_why.append(f"{head}, refused: loss departs {departure:.1%} (tolerance {tol:.0%})"
                            if departure is not None else f"{head}, refused: no loss to compare")
        elif conf.wins:
            if best is None or conf.median > found[best].median:
                best = name
        elif conf.slower:
            best_why.append(f"{head}, slower in every round")
        else:
            best_why.append(f"{head}, inconclusive: beyond the noise (±{band:.0%}) in "
                            f"{conf.rounds_beyond_noise} of {rounds} rounds, {conf.required_rounds} needed")
    rounds = max((len(c.ratios) for c in found.values()), default=0)
    if best is not None:
        conf = found[best]
        departure = figures["candidates"][best]["loss_departure"]
        why = (f"probed: {conf.median:.2f}x {reference} ({conf.low:.2f}-{conf.high:.2f}), loss within "
               f"{departure:.2%}, noise ±{band:.0%}, {rounds} rounds")
        return best, why, figures
    return reference, f"probed, {reference} kept" + (": " + "; ".join(best_why) if best_why else ""), figures


def run_probe(reference: str, candidates: list[str], make_arm: Callable[[str], Arm], run_steps: int,
              share: float) -> Decision:
    """Measures `reference` (two copies) and `candidates` on their own arms, interleaved, within
    the budget; returns the decision. `make_arm(policy)` builds a copy of the run in that policy."""
    started = time.perf_counter()
    arms: dict[str, Arm] = {}
    try:
        return _probe(reference, candidates, make_arm, run_steps, share, arms, started)
    except Exception as exc:    # noqa: BLE001 - the run's own step raises it again, with its context
        return Decision(reference, f"not probed: the step failed on a copy of the run ({_first_line(exc)})",
                        {}, time.perf_counter() - started)
    finally:
        for arm in arms.values():
            arm.close()
        arms.clear()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()     # the copies' memory back before the run's own build


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def _probe(reference: str, candidates: list[str], make_arm: Callable[[str], Arm], run_steps: int, share: float,
           arms: dict[str, Arm], started: float) -> Decision:
    """run_probe's measuring, into `arms` (which run_probe closes)."""
    # The reference's two copies first (the first build pays the process's one-time costs, which
    # the run's own build then does not): the second's build and warm-up say what an arm costs to
    # set up, and a warm step predicts the run; the others are built only where the probe fits.
    arms[reference] = make_arm(reference)
    arms[reference].window(WARMUP_STEPS - 1)
    built = time.perf_counter()
    arms[AGAIN] = make_arm(reference)
    arms[AGAIN].window(WARMUP_STEPS)
    setup_s = time.perf_counter() - built
    step_s, _ = arms[reference].window(1)
    predicted = step_s * run_steps
    budget = budget_s(predicted, share)
    count = 2 + len(candidates)
    smallest = setup_s * (count - 2) + step_s * count * MIN_ROUNDS * MIN_WINDOW_STEPS
    # The budget is the probe's own cost: from the reference's first copy on (its build and first
    # step paid the process's one-time costs, imports and kernel selection, which the run's own
    # build would otherwise pay; `seconds` reports them all the same).
    if share >= 1:     # measure whatever it costs (within the cap)
        budget = max(budget, min(smallest + (time.perf_counter() - built), PROBE_CAP_S))
    elif smallest > budget - (time.perf_counter() - built):
        return Decision(reference, f"not probed: this run is predicted to take {predicted:.1f} s, and a probe "
                                   f"would take over {share:.0%} of it ({smallest:.1f} s more)",
                        {"predicted_s": predicted}, time.perf_counter() - started)
    failed: dict[str, str] = {}     # a candidate this model cannot train in (an op without a kernel)
    for name in candidates:
        try:
            arms[name] = make_arm(name)
            arms[name].window(WARMUP_STEPS)
        except Exception as exc:   # noqa: BLE001 - that precision's failure, not the run's
            failed[name] = _first_line(exc)
            arms.pop(name, None)
    running = [name for name in candidates if name not in failed]
    plan = plan_windows(step_s, len(arms), budget - (time.perf_counter() - built))
    rounds, window = plan if plan is not None else (MIN_ROUNDS, MIN_WINDOW_STEPS)
    losses: dict[str, list[float]] = {name: [] for name in arms}

    def measure(key: str, number: int) -> Measured | None:
        if key in failed:
            return None
        try:
            seconds, loss = arms[key].window(window)
        except Exception as exc:   # noqa: BLE001 - mid-probe: this arm's rounds are dropped
            failed[key] = _first_line(exc)
            return None
        losses[key].append(loss)
        return Measured(window / seconds)

    found = confirm(reference, running, rounds, measure, lambda v, b: v / b) if running else {}
    # A candidate that failed in a later round is not chosen on the rounds before it.
    policy, why, figures = decide(reference, {k: v for k, v in found.items() if k not in failed}, losses)
    if failed:
        why += "; " + "; ".join(f"{name} failed: {line}" for name, line in failed.items())
        figures["failed"] = failed
    figures.update(rounds=rounds, window_steps=window, predicted_s=predicted, step_s=step_s)
    return Decision(policy, why, figures, time.perf_counter() - started)


def probe_config(cfg, policy: str, threads: int):
    """A copy of the run's configuration for one arm: `policy`, the run's thread count, nothing
    recorded, no checkpoints."""
    out = copy.deepcopy(cfg)
    out.precision.policy = policy
    out.tracking.record = False
    out.progress = False
    out.checkpoint.every = 0
    out.threads = threads     # chosen once for the run (no second look at the load)
    return out


# ------------------------------------------------------------------ remembered decisions
CACHE_FILE = "probe-decisions.json"
CACHE_ENTRIES = 200      # the newest kept: one per model and machine a user trains


def cache_key(model: torch.nn.Module, example: torch.Tensor, batch: int, device_name: str, threads: int,
              candidates: list[str]) -> str:
    """What a decision holds for: the model's structure (its modules and their shapes, as repr
    prints them), the input's shape and dtype, the batch, the device, the thread count, the
    candidates and torch's version."""
    parts = {"structure": hashlib.sha256(repr(model).encode()).hexdigest(),
             "input": [list(example.shape[1:]), str(example.dtype)], "batch": batch, "device": device_name,
             "threads": threads, "candidates": candidates, "torch": torch.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _cache_path() -> Path:
    return user_cache_dir() / CACHE_FILE


def cached_decision(key: str) -> dict | None:
    """The decision kept under `key`, or None (none kept, or a file that is not ours: ignored)."""
    path = _cache_path()
    if not path.exists():
        return None
    try:
        entries = read_json(path, "the probe's cache")
    except UserError:
        return None
    entry = entries.get(key)
    return entry if isinstance(entry, dict) and isinstance(entry.get("policy"), str) else None


def remember(key: str, decision: Decision, run_id: str) -> None:
    """Keeps a measured decision for the next run of the same model here (best effort: a cache
    that cannot be written costs the next run a probe, never this one its training)."""
    path = _cache_path()
    try:
        entries = read_json(path, "the probe's cache") if path.exists() else {}
    except UserError:
        entries = {}
    entries[key] = {"policy": decision.policy, "why": decision.why, "run_id": run_id, "time": time.time(),
                    "figures": decision.figures}
    entries = dict(sorted(entries.items(), key=lambda kv: kv[1].get("time", 0))[-CACHE_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries))
        tmp.replace(path)
    except OSError:
        pass


# ------------------------------------------------------------------ the run's decision
def probed_precision(cfg, dataset, task, setting: Setting, run_id: str, device: torch.device,
                     say: Callable[[str], None] = print) -> tuple[Setting, float]:
    """The run's precision Setting where `--precision auto` chose it (`setting.why` set): kept by
    the rule where the probe does not apply or does not pay, else measured (or read from the
    cache); writes the choice into `cfg`. Returns the Setting and the seconds probing took."""
    from scaletrain.precision.hardware import device_facts
    from scaletrain.training.build import build_training, set_thread_pools
    if setting.why is None or not cfg.probe or setting.name != "precision":
        return setting, 0.0
    reference = setting.value
    facts = device_facts(device)
    candidates = precision_candidates(facts, reference)
    if not candidates:
        return setting, 0.0
    batch = cfg.per_replica_batch_size or cfg.batch_size
    rule = setting.why.removeprefix("auto: ")
    try:
        run_steps = max(len(dataset.train) // max(batch, 1), 1) * cfg.epochs
    except TypeError:     # a stream of unknown length: nothing predicts the run, nothing bounds a probe
        return Setting("precision", reference, f"auto: {rule}; not probed: the data's length is unknown"), 0.0
    short = too_short(run_steps, 2 + len(candidates), cfg.probe_share)
    if short:    # decided from the step count: no step taken, no look at the load
        return Setting("precision", reference, f"auto: {rule}; {short}"), 0.0
    threads = set_thread_pools(cfg).setting.value     # the run's count: the arms run with it
    key = _key(cfg, dataset, batch, f"{facts.kind} {facts.name}", threads, [reference, *candidates])
    kept = cached_decision(key) if key else None
    # A cache file is the user's file: only a precision this run could have chosen is taken from it.
    if kept is not None and kept["policy"] in (reference, *candidates):
        cfg.precision.policy = kept["policy"]
        return Setting("precision", kept["policy"], f"cached from run {kept['run_id']}: {kept['why']}",
                       kept.get("figures")), 0.0

    def make_arm(policy: str) -> Arm:
        return Arm(build_training(probe_config(cfg, policy, threads), dataset=dataset, task=task,
                                  checked=True).trainer, dataset)
    say(f"probing the precision on copies of this run's step: {', '.join([reference, *candidates])}, at most "
        f"{cfg.probe_share:.0%} of the run's time (--no-probe: the rule alone)")
    decision = run_probe(reference, candidates, make_arm, run_steps, cfg.probe_share)
    cfg.precision.policy = decision.policy
    if decision.measured and key:
        remember(key, decision, run_id)
    return Setting("precision", decision.policy, f"auto: {decision.why}", decision.figures), decision.seconds


def _key(cfg, dataset, batch: int, device: str, threads: int, candidates: list[str]) -> str | None:
    """The cache key of this run's model, built on the meta device (its structure, no memory);
    None where the model cannot be built there (a user's model that computes while it is built):
    such a run is probed each time, never cached under a wrong key."""
    from scaletrain.adapters import model_to_train
    from scaletrain.tasks import build_task
    try:
        example = tensors(dataset.examples.x)[0][:1]
        outputs = build_task(cfg.task, dataset.task).output_size(dataset)
        with torch.device("meta"):
            model = model_to_train(cfg.model.name, dataset.input_shape, outputs, **cfg.model.options)
    except Exception:   # noqa: BLE001 - the user's builder, on a device it was not written for
        return None
    return cache_key(model, example, batch, device, threads, candidates)
