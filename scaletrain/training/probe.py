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
after the reference's two copies. A decision is kept in the user's cache folder (probe_cache.py;
what a run asks and takes from it: probe_settings.py) under the model's structure, input, batch,
device, threads and torch version, so the next run of the same model starts at once.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from scaletrain.precision.hardware import CPU_BF16_FLAGS, NATIVE_BF16, DeviceFacts
from scaletrain.training.allocator import release_freed_memory
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
# where the budget allows; a window is at least MIN_WINDOW_STEPS steps, or one step where a step
# takes LONG_STEP_S or more (a host's timer and jitter are small against it, and the rounds that
# settle a clear verdict then cost half: the small GPT's 0.14 s step, probed in 600 steps, paid 18
# measured steps of its 24, 4 % of its run, against 9).
MIN_ROUNDS, MAX_ROUNDS = 3, 5
MIN_WINDOW_STEPS = 2
LONG_STEP_S = 0.1
WARMUP_STEPS = 2      # per arm, untimed: allocation and kernel selection (the second one times the reference)
MAX_WINDOW_STEPS = 50
MAX_ARM_STEPS = WARMUP_STEPS + MAX_ROUNDS * MAX_WINDOW_STEPS
# Compile, measured in the precision chosen: its arm's key beside the eager step's. A compile is
# probed only where the budget left holds COMPILE_FLOOR_S (the default recipe's 1-D CNN compiled
# cold in 19 s on a 2-core EPYC; from the compile cache, 2.4 s: BENCHMARKS.md), and chosen
# only where the steps it saves come to COMPILE_MARGIN times what compiling took.
COMPILED = "compiled"
COMPILE_FLOOR_S = 20.0
COMPILE_MARGIN = 2.0


@dataclass(frozen=True)
class Switch:
    """A setting the probe turns on only where its arm beats the eager step in the precision chosen
    and repays its one-time cost (compiling, capturing) COMPILE_MARGIN times over the run: its arm's
    key (an arm is `<precision> <key>`), how the start line names the arm and the cost, and the run's
    setting it decides."""
    key: str
    arm: str
    cost: str
    setting: str


COMPILE = Switch(COMPILED, "compiled", "compile", "compile")
# Whole-step CUDA graphs (training/cuda_graphs.py) on a GPU: a launch-bound step's hundreds of
# kernel launches replayed as one; the capture is its cost.
GRAPHS = Switch("graphs", "CUDA graph", "capture", "cuda_graphs")


def precision_candidates(facts: DeviceFacts, reference: str) -> list[str]:
    """The precisions besides `reference` (the rule's) that can pay on this device: bf16-mixed where
    it computes bfloat16 natively (AVX512-BF16 or AMX on a CPU; compute capability 8.0 on CUDA),
    fp16-mixed on CUDA's tensor cores, fp8 on float8 tensor cores (8.9), and fp32."""
    if facts.kind not in ("cpu", "cuda"):    # an XLA device compiles each shape: a few steps measure its compiler
        return []
    native_bf16 = ((facts.kind == "cpu" and bool(facts.cpu_flags & CPU_BF16_FLAGS))
                   or (facts.kind == "cuda" and facts.capability is not None and facts.capability >= NATIVE_BF16))
    names = ["fp32", *(["bf16-mixed"] if native_bf16 else []), *(["fp16-mixed"] if facts.kind == "cuda" else []),
             *(["fp8"] if _float8_here(facts) else [])]
    return [n for n in names if n != reference]


def _float8_here(facts: DeviceFacts) -> bool:
    """fp8 is a candidate on float8 tensor cores (CUDA 8.9 and newer) with torchao installed; never
    emulated (on a CPU it is only ever slower). Its arm converts every divisible layer (torchao's
    rule); once chosen, the run measures which layer shapes pay (training/float8_shapes.py)."""
    from scaletrain.precision.float8 import FP8_CAPABILITY, torchao_installed
    return (facts.kind == "cuda" and facts.capability is not None and facts.capability >= FP8_CAPABILITY
            and torchao_installed())


@dataclass
class Decision:
    """One setting's choice: its value (a precision's name; compile on or off), why (the start
    line's words) and the figures measured for it (the run's record)."""
    value: object
    why: str
    figures: dict = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return bool(self.figures.get("rounds"))


@dataclass
class Probed:
    """What a probe decided: the precision (None where it was not a question: named, or nothing
    else native here), compile (None where named) and the seconds it took."""
    precision: Decision | None
    compile: Decision | None
    seconds: float = 0.0
    step_s: float | None = None     # the reference's warm step, as measured (None: no step taken)
    graphs: Decision | None = None  # CUDA graphs (None where not a question: named, or not a GPU)

    def decided(self) -> dict[str, tuple[object, str, dict | None]]:
        """Each question's (value, why, figures) for the run's settings."""
        return {name: (d.value, f"auto: {d.why}", d.figures or None)
                for name, d in (("precision", self.precision), ("compile", self.compile),
                                (GRAPHS.setting, self.graphs)) if d is not None}

    def cache_entry(self) -> dict:
        """What the cache keeps of it: each question it measured (a compile that did not fit this
        run's budget stays open, and a longer run asks it)."""
        out: dict = {}
        if self.precision is not None and self.precision.measured:
            out.update(policy=self.precision.value, why=self.precision.why, figures=self.precision.figures)
        for name, decision in (("compile", self.compile), (GRAPHS.setting, self.graphs)):
            if decision is not None and decision.measured:
                out[name] = decision.figures
        if out or self.step_s:    # (a step time alone tells the next run whether a compile can fit)
            out["step_s"] = self.step_s
        return out


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
    its step. `window(k)` trains k steps and returns (seconds, mean loss). A trainer that runs in a
    CUDA graph captures its step on the first batch, the capture's own steps undone."""

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
        self._pending = None
        if trainer.use_graphs:
            from scaletrain.training.cuda_graphs import capture_undone
            self._pending = self._next()
            self.step = capture_undone(trainer, self.step, *self._pending)

    def _next(self):
        if self._pending is not None:    # the batch the capture read, trained first
            batch, self._pending = self._pending, None
            return batch
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


def min_window(step_s: float) -> int:
    """The fewest steps a window holds at `step_s` a step."""
    return 1 if step_s >= LONG_STEP_S else MIN_WINDOW_STEPS


def plan_windows(step_s: float, arms: int, budget: float) -> tuple[int, int] | None:
    """(rounds, steps per window) that fit `budget` seconds at `step_s` a step, the most rounds
    first; None where even the smallest probe does not fit."""
    for rounds in range(MAX_ROUNDS, MIN_ROUNDS - 1, -1):
        window = int(budget / (step_s * arms * rounds))
        if window >= min_window(step_s):
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


def decide_compile(policy: str, conf: Confirmation, departure: float | None, compile_s: float, step_s: float,
                   run_steps: int, switch: Switch = COMPILE) -> tuple[bool, str, dict]:
    """A switch (compile, or CUDA graphs) on or off from its rounds against the eager step in
    `policy`: it must win (rounds.py), keep its loss, and repay its one-time cost: the steps it
    saves over the run's `run_steps` must come to COMPILE_MARGIN times the cost's measured seconds
    (`compile_s`). (The measured compile is a cold one; the run's own reads inductor's cache that
    the probe filled, so the rule errs towards eager.)"""
    tol = tolerance(policy, policy)
    saved = run_steps * step_s * (1 - 1 / conf.median) if conf.ratios and conf.median > 0 else 0.0
    figures = {"ratios": conf.ratios, "noise": {"ratios": list(conf.noise.ratios) if conf.noise else [],
                                                 "band": conf.band},
               "rounds_beyond_noise": conf.rounds_beyond_noise, "loss_departure": departure, "loss_tolerance": tol,
               "compile_s": compile_s, "step_s": step_s, "run_steps": run_steps, "saved_s": saved,
               "rounds": len(conf.ratios), "policy": policy}
    if not conf.ratios:
        return False, "probed, off: no round measured", figures
    head = f"{switch.arm} {conf.median:.2f}x eager ({conf.low:.2f}-{conf.high:.2f})"
    if not within_tolerance(departure, tol):
        return False, (f"probed, off: {head}, refused: loss departs {departure:.1%} (tolerance {tol:.0%})"
                       if departure is not None else f"probed, off: {head}, refused: no loss to compare"), figures
    if conf.slower:
        return False, f"probed, off: {head}, slower in every round", figures
    if not conf.wins:
        return False, (f"probed, off: {head}, inconclusive: beyond the noise (±{conf.band:.0%}) in "
                       f"{conf.rounds_beyond_noise} of {len(conf.ratios)} rounds, {conf.required_rounds} "
                       "needed"), figures
    if saved < COMPILE_MARGIN * compile_s:
        return False, (f"probed, off: {head}, but its {compile_s:.0f} s {switch.cost} would save {saved:.0f} s over "
                       f"{run_steps:,} steps ({COMPILE_MARGIN:g}x its cost needed)"), figures
    repaid = (f"its {compile_s:.0f} s {switch.cost} repaid {saved / compile_s:.1f}x" if compile_s >= 0.5
              else "compiled from the cache" if switch is COMPILE else f"its {switch.cost} under a second")
    return True, (f"probed: {head}, loss within {departure:.2%}, {repaid} over {run_steps:,} steps, "
                  f"noise ±{conf.band:.0%}, {len(conf.ratios)} rounds"), figures


def compile_from_figures(figures: dict, run_steps: int, switch: Switch = COMPILE) -> tuple[bool, str, dict]:
    """A kept switch decision's figures judged again for this run's length (a decision cached
    from a longer run may not repay on a shorter one)."""
    noise = Confirmation(AGAIN, [float(r) for r in figures["noise"]["ratios"]])
    conf = Confirmation(switch.key, [float(r) for r in figures["ratios"]], noise=noise)
    return decide_compile(str(figures["policy"]), conf, figures.get("loss_departure"), float(figures["compile_s"]),
                          float(figures["step_s"]), run_steps, switch)


def run_probe(reference: str, candidates: list[str], make_arm: Callable[[str], Arm], run_steps: int,
              share: float, compile_asked: bool = False, graphs_asked: bool = False) -> Probed:
    """Measures `reference` (two copies) against the precision `candidates`, then (`compile_asked`)
    the compiled step against the eager one in the precision chosen, then (`graphs_asked`, where
    compile stays off) the step captured in a CUDA graph, each on its own arm, interleaved, within
    the budget. `make_arm(key)` builds a copy of the run: `key` is a precision's name, with a
    switch's key after it (" compiled", " graphs") for that switch's copy."""
    started = time.perf_counter()
    arms: dict[str, Arm] = {}
    try:
        return _probe(reference, candidates, make_arm, run_steps, share, compile_asked, arms, graphs_asked)
    except Exception as exc:    # noqa: BLE001 - the run's own step raises it again, with its context
        why = f"not probed: the step failed on a copy of the run ({_first_line(exc)})"
        return Probed(Decision(reference, why) if candidates else None, Decision(False, why) if compile_asked else None,
                      time.perf_counter() - started, graphs=Decision(False, why) if graphs_asked else None)
    finally:
        for arm in arms.values():
            arm.close()
        arms.clear()
        release_freed_memory()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()     # the copies' memory back before the run's own build
        # (the seconds of a probe that returned are set by _probe, from the same start)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def _probe(reference: str, candidates: list[str], make_arm: Callable[[str], Arm], run_steps: int, share: float,
           compile_asked: bool, arms: dict[str, Arm], graphs_asked: bool = False) -> Probed:
    """run_probe's measuring, into `arms` (which run_probe closes)."""
    started = time.perf_counter()
    # The reference's two copies first (the first build pays the process's one-time costs, which
    # the run's own build then does not): the second's build and warm-up say what an arm costs to
    # set up, and a warm step predicts the run; the others are built only where the probe fits.
    arms[reference] = make_arm(reference)
    arms[reference].window(WARMUP_STEPS - 1)
    built = time.perf_counter()
    step_s, _ = arms[reference].window(1)
    predicted = step_s * run_steps
    if not candidates and not graphs_asked and share < 1 and budget_s(predicted, share) < COMPILE_FLOOR_S:
        # Compile alone was asked, and one copy's step already says no compile fits: no second copy.
        return Probed(None, Decision(False, compile_unfit(budget_s(predicted, share), share, predicted)),
                      time.perf_counter() - started, step_s)
    again = time.perf_counter()
    arms[AGAIN] = make_arm(reference)
    arms[AGAIN].window(WARMUP_STEPS)
    setup_s = time.perf_counter() - again
    # The budget is the probe's own cost: from the reference's first copy on (its build and first
    # step paid the process's one-time costs, imports and kernel selection, which the run's own
    # build would otherwise pay; `seconds` reports them all the same).
    budget = budget_s(predicted, share)
    count = 2 + (len(candidates) or 1)     # the precisions' arms (or a switch's: its own fit below)
    smallest = setup_s * (count - 2) + step_s * count * MIN_ROUNDS * min_window(step_s)
    spent = time.perf_counter() - built
    # A switch's smallest rounds: two new eager copies where the precisions' rounds went first, its
    # own copy, and three arms' rounds.
    switch_rounds = setup_s * (3 if candidates else 1) + step_s * 3 * MIN_ROUNDS * min_window(step_s)
    graphs_reserve = switch_rounds if graphs_asked else 0.0
    if share >= 1:     # measure whatever it costs (within the cap)
        budget = max(budget, min(smallest + spent + graphs_reserve + (COMPILE_FLOOR_S if compile_asked else 0),
                                 PROBE_CAP_S))
    elif smallest > budget - spent:
        why = (f"not probed: this run is predicted to take {predicted:.1f} s, and a probe would take over "
               f"{share:.0%} of it ({smallest:.1f} s more)")
        return Probed(Decision(reference, why, {"predicted_s": predicted}) if candidates else None,
                      Decision(False, why) if compile_asked else None, time.perf_counter() - started, step_s,
                      Decision(False, why) if graphs_asked else None)
    deadline = built + budget
    # A compile is measured after the precisions, in their choice, where the budget holds one
    # (COMPILE_FLOOR_S) and its own smallest rounds beside the precisions' smallest; CUDA graphs
    # last, where compile stays off. The precisions' rounds leave them that much, and otherwise
    # take the whole budget.
    compile_reserve = COMPILE_FLOOR_S + switch_rounds
    left = budget - spent - (smallest if candidates else 0.0) - graphs_reserve
    compile_fits = share >= 1 or left >= compile_reserve
    precision = None
    if candidates:
        precision = _precision_stage(reference, candidates, make_arm, arms, step_s,
                                     deadline - (compile_reserve if compile_asked and compile_fits else 0.0)
                                     - graphs_reserve)
        precision.figures.update(predicted_s=predicted, step_s=step_s)
    policy = precision.value if precision is not None else reference
    compiled = None
    if compile_asked and not compile_fits:
        compiled = Decision(False, compile_unfit(budget, share, predicted))
    elif compile_asked:
        compiled = _switch_stage(COMPILE, policy, reference, make_arm, arms, run_steps, step_s, setup_s, deadline)
    graphs = None
    if graphs_asked and compiled is not None and compiled.value:
        graphs = Decision(False, "not probed: compiled (a compiled step's graphs are torch.compile's to capture)")
    elif graphs_asked:
        graphs = _switch_stage(GRAPHS, policy, reference, make_arm, arms, run_steps, step_s, setup_s, deadline)
    return Probed(precision, compiled, time.perf_counter() - started, step_s, graphs)


def compile_unfit(budget: float, share: float, predicted: float) -> str:
    return (f"not probed: the probe's {budget:.0f} s ({share:.0%} of the run's predicted {predicted:.0f} s) cannot "
            f"hold a compile ({COMPILE_FLOOR_S:.0f} s or more here)")


def _window_measure(arms: dict[str, Arm], window: int, losses: dict[str, list[float]],
                    failed: dict[str, str], seconds: dict[str, list[float]] | None = None):
    """confirm()'s measure over `arms` (keyed as confirm names them): samples/s of one window, its
    mean loss into `losses`; an arm that raises is dropped (its failure into `failed`)."""
    def measure(key: str, number: int) -> Measured | None:
        if key in failed:
            return None
        try:
            took, loss = arms[key].window(window)
        except Exception as exc:   # noqa: BLE001 - mid-probe: this arm's rounds are dropped
            failed[key] = _first_line(exc)
            return None
        losses.setdefault(key, []).append(loss)
        if seconds is not None:
            seconds.setdefault(key, []).append(took / window)
        return Measured(window / took)
    return measure


def _precision_stage(reference: str, candidates: list[str], make_arm: Callable[[str], Arm], arms: dict[str, Arm],
                     step_s: float, deadline: float) -> Decision:
    """The precisions' rounds: the reference (and its second copy, in `arms` already) against each
    candidate built here; a candidate that cannot be built or fails is named, never chosen."""
    failed: dict[str, str] = {}     # a candidate this model cannot train in (an op without a kernel)
    for name in candidates:
        try:
            arms[name] = make_arm(name)
            arms[name].window(WARMUP_STEPS)
        except Exception as exc:   # noqa: BLE001 - that precision's failure, not the run's
            failed[name] = _first_line(exc)
            arms.pop(name, None)
    running = [name for name in candidates if name not in failed]
    keys = [reference, AGAIN, *running]
    plan = plan_windows(step_s, len(keys), deadline - time.perf_counter())
    rounds, window = plan if plan is not None else (MIN_ROUNDS, min_window(step_s))
    losses: dict[str, list[float]] = {}
    measure = _window_measure({k: arms[k] for k in keys}, window, losses, failed)
    found = confirm(reference, running, rounds, measure, lambda v, b: v / b, until_settled=True) if running else {}
    # A candidate that failed in a later round is not chosen on the rounds before it.
    policy, why, figures = decide(reference, {k: v for k, v in found.items() if k not in failed}, losses)
    if failed:
        why += "; " + "; ".join(f"{name} failed: {line}" for name, line in failed.items())
        figures["failed"] = failed
    measured = max((len(c.ratios) for c in found.values()), default=0)
    figures.update(rounds=measured or rounds, rounds_planned=rounds, window_steps=window)
    return Decision(policy, why, figures)


def _switch_stage(switch: Switch, policy: str, reference: str, make_arm: Callable[[str], Arm], arms: dict[str, Arm],
                  run_steps: int, step_s: float, setup_s: float, deadline: float) -> Decision:
    """The switch's step (compiled, or captured in a CUDA graph) against the eager one in `policy`
    (the precision chosen), with the eager step's second copy as the noise; on only where
    decide_compile says it repays."""
    eager, eager_again = reference, AGAIN
    if any(key not in (reference, AGAIN) for key in arms):
        # Earlier rounds trained their copies on: the loss check compares the same steps, so the
        # eager step and its noise are measured on new copies too (the old ones' memory first).
        for key in list(arms):
            arms.pop(key).close()
        eager, eager_again = policy, f"{policy} again"
        built = time.perf_counter()
        arms[eager] = make_arm(policy)
        arms[eager].window(WARMUP_STEPS)
        setup_s = time.perf_counter() - built
        arms[eager_again] = make_arm(policy)
        arms[eager_again].window(WARMUP_STEPS)
    start = time.perf_counter()
    try:
        arms[switch.key] = make_arm(f"{policy} {switch.key}")
        arms[switch.key].window(WARMUP_STEPS)    # the first steps compile (a second graph for the second)
    except Exception as exc:   # noqa: BLE001 - the switch's failure, not the run's: it trains eager
        arms.pop(switch.key, None)
        verb = "compiling" if switch is COMPILE else f"the {switch.arm}"
        return Decision(False, f"probed, off: {verb} failed: {_first_line(exc)}", {"failed": _first_line(exc)})
    # What compiling (capturing) cost beyond an eager copy's build and warm-up.
    cost_s = max(time.perf_counter() - start - setup_s, 0.0)
    plan = plan_windows(step_s, 3, deadline - time.perf_counter())
    rounds, window = plan if plan is not None else (MIN_ROUNDS, min_window(step_s))
    losses: dict[str, list[float]] = {}
    seconds: dict[str, list[float]] = {}
    failed: dict[str, str] = {}
    measure = _window_measure({policy: arms[eager], AGAIN: arms[eager_again], switch.key: arms[switch.key]},
                              window, losses, failed, seconds)
    conf = confirm(policy, [switch.key], rounds, measure, lambda v, b: v / b, until_settled=True)[switch.key]
    if switch.key in failed:
        return Decision(False, f"probed, off: the {switch.arm} step failed: {failed[switch.key]}",
                        {"failed": failed[switch.key]})
    eager_step = statistics.median(seconds[policy]) if seconds.get(policy) else step_s
    on, why, figures = decide_compile(policy, conf, loss_departure(losses.get(switch.key, []), losses.get(policy, [])),
                                      cost_s, eager_step, run_steps, switch)
    figures.update(window_steps=window, rounds_planned=rounds)
    return Decision(on, why, figures)


def probe_config(cfg, key: str, threads: int, per_replica_batch: int | None = None):
    """A copy of the run's configuration for one arm: `key`'s precision (and compile where it says
    " compiled", CUDA graphs where " graphs"), the run's thread count, nothing recorded, no
    checkpoints. `per_replica_batch`: a run of several processes is measured as one of them,
    training its share of the batch alone."""
    policy, _, compiled = key.partition(" ")
    out = copy.deepcopy(cfg)
    if compiled == GRAPHS.key:
        out.cuda_graphs = True
    if per_replica_batch is not None:
        out.batch_size, out.per_replica_batch_size, out.accumulate_to_global = per_replica_batch, None, False
        out.distributed = type(cfg.distributed)()
    out.precision.policy = policy
    out.compile = compiled == COMPILED
    out.tracking.record = False
    out.progress = False
    out.checkpoint.every = 0
    out.threads = threads     # chosen once for the run (no second look at the load)
    return out
