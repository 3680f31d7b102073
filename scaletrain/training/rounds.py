"""Contestants measured in interleaved rounds, so that the machine's load cannot pick the winner:
the rule autotune confirms its finalists by and the run's own probe (probe.py) chooses by.

Measured one after another, on a machine whose load changes (a shared CPU, a laptop's clock), a
ratio between two settings measures *when* each ran as much as what it is. Here the given (reference)
configuration and the others run round after round (A B C, B C A, C A B, ...:
`../shared/MEASURE.md`), and a contestant's advantage is the paired ratio against the reference of
the same round, reported as its median and its range over the rounds. The reference also runs a
second time each round (`AGAIN`): its ratio against itself is the noise, taken both ways (a
reference that reads 0.70x against itself is noise of +-30 %, as is one that reads 1.3x). A
contestant wins only if it beat the reference by more than that noise in at least
MIN_ROUNDS_BEYOND_NOISE rounds; otherwise it is inconclusive (a tie) and the simpler setting (the
reference) stays. (Under load the given configuration against itself read 0.44x (0.23-1.32) in the
run that crowned a finalist at 3.01x which re-measured at 1.14x: issue 64; another judged
bf16-mixed a 1.39x winner after one round, though the same setup run twice differed by 0.70x:
issue 95.)
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# MEASURE.md: steady-state throughput over at least 50 steps, or 10 s. The search measures every
# candidate over the same seeded steps (its loss check compares them step for step); the
# confirmation compares samples/s only, so a contestant whose measured steps would take longer
# than WINDOW_S is confirmed over about WINDOW_S of them. On a loaded 2-core machine the given
# configuration's two threads ran at 140 samples/s: a minute per confirmation run at full length.
WINDOW_S = 10.0
MIN_STEPS = 4
# The given configuration's second run of each round: the noise floor's contestant.
AGAIN = "given-again"
# The per-epoch mean training loss of a candidate may differ from the reference's by this fraction
# of the reference's: float32 reorderings (threads, compile, accumulation) stay far inside 2 %;
# 16-bit arithmetic moves the loss more without changing what is learned. Measured in the note
# of docs/autotune.md; both can be set with --loss-tolerance / --loss-tolerance-16bit.
LOSS_TOLERANCE = 0.02
LOSS_TOLERANCE_16BIT = 0.05


def loss_departure(mine: list[float], reference: list[float]) -> float | None:
    """How far a contestant's losses strayed from the reference's over the same steps: the largest
    relative difference (nan or inf where a loss was not finite), None with nothing to compare.
    Autotune's loss check and the probe's (tolerances above)."""
    pairs = list(zip(mine, reference, strict=False))    # an arm that failed mid-way: the steps both ran
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs) if pairs else None


def within_tolerance(departure: float | None, tolerance: float) -> bool:
    return departure is not None and math.isfinite(departure) and departure <= tolerance


# Rounds a winner must have beaten the reference by more than the noise in.
MIN_ROUNDS_BEYOND_NOISE = 3


def window_steps(images_per_sec: float | None, batch_size: int, steps: int, measured_epochs: int) -> int:
    """Optimizer steps per epoch for a contestant last measured at `images_per_sec`: `steps`, or
    fewer where those would take longer than WINDOW_S over its measured epochs (never below
    MIN_STEPS). Unmeasured: `steps`."""
    if not images_per_sec or images_per_sec <= 0 or not math.isfinite(images_per_sec):
        return steps
    fit = math.ceil(WINDOW_S * images_per_sec / (batch_size * measured_epochs))
    return min(steps, max(fit, MIN_STEPS))


@dataclass(slots=True)
class Measured:
    """One confirmation run: the objective's value, and (time to target) the final test metric,
    signed so that higher is better."""
    value: float
    test: float | None = None


@dataclass(slots=True)
class Confirmation:
    """One finalist's interleaved rounds against the given configuration."""
    key: str
    ratios: list[float] = field(default_factory=list)   # per round: its advantage (>1: better than given)
    test_deltas: list[float] = field(default_factory=list)   # per round: its test metric minus the given's
    test_tolerance: float | None = None     # how much test metric a winner may lose (None: not checked)
    noise: Confirmation | None = None     # the given configuration against itself, the same rounds

    @property
    def loses_test(self) -> bool:
        """Its median test metric is below the given configuration's by more than the tolerance."""
        return (self.test_tolerance is not None and bool(self.test_deltas)
                and statistics.median(self.test_deltas) < -self.test_tolerance)

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def low(self) -> float:
        return min(self.ratios)

    @property
    def high(self) -> float:
        return max(self.ratios)

    @property
    def band(self) -> float:
        """The noise, both ways: the largest distance of a ratio of the reference against itself
        from 1, read as a factor (0.70x and 1.43x are both 0.43); 0 where none was measured."""
        if self.noise is None or not self.noise.ratios:
            return 0.0
        return max(max(r, 1 / r) - 1 for r in self.noise.ratios if r > 0)

    @property
    def rounds_beyond_noise(self) -> int:
        """Rounds in which it beat the reference by more than the noise."""
        return sum(1 for r in self.ratios if r > 1 + self.band)

    @property
    def required_rounds(self) -> int:
        return MIN_ROUNDS_BEYOND_NOISE

    @property
    def beyond_noise(self) -> bool:
        """Its median advantage is beyond the noise (True where none was measured and it is above 1)."""
        return bool(self.ratios) and self.median > 1 + self.band

    @property
    def wins(self) -> bool:
        """It beat the reference by more than the noise in at least MIN_ROUNDS_BEYOND_NOISE rounds
        (fewer rounds measured: inconclusive), and kept its test metric."""
        return self.rounds_beyond_noise >= MIN_ROUNDS_BEYOND_NOISE and not self.loses_test

    @property
    def slower(self) -> bool:
        """The given configuration beat it in every round: no tie, a loss."""
        return bool(self.ratios) and self.high < 1.0

    def describe(self) -> str:
        return f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f}, {len(self.ratios)} rounds)"


def interleave(keys: list[str], rounds: int) -> list[list[str]]:
    """Each round's order: every key once, the first position rotating round by round, so no
    candidate always runs first (or right after the same neighbour)."""
    return [keys[r % len(keys):] + keys[:r % len(keys)] for r in range(rounds)]


def settled(found: dict[str, Confirmation], rounds_left: int) -> bool:
    """Whether the rounds left could change no verdict: every contestant already wins (3 rounds
    beyond the noise measured in the same rounds), or could not reach MIN_ROUNDS_BEYOND_NOISE
    even if it beat the noise in every round left (a tie or a loss: the reference stays)."""
    return all(c.wins or c.rounds_beyond_noise + rounds_left < MIN_ROUNDS_BEYOND_NOISE for c in found.values())


def confirm(given: str, finalists: list[str], rounds: int, measure: Callable[[str, int], Measured | None],
            advantage: Callable[[float, float], float], deadline: float | None = None,
            test_tolerance: float | None = None, noise: bool = True, until_settled: bool = False,
            ) -> dict[str, Confirmation]:
    """Runs `given` and `finalists` `rounds` times, interleaved, and with `noise` the given
    configuration a second time (`measure(AGAIN, round)`); `measure(key, round)` returns the run's
    figures (None: it failed, the round is dropped for the pair). `advantage(value, given_value)` is
    how many times better `value` is. Stops between runs at `deadline`, and with `until_settled`
    after the round that leaves every verdict `settled` (the run's probe: the rounds it need not
    measure are its user's time). Returns each finalist's confirmation (its `noise`: the given
    configuration against itself, None without `noise`)."""
    floor = Confirmation(AGAIN) if noise else None
    found = {key: Confirmation(key, test_tolerance=test_tolerance, noise=floor) for key in finalists}
    against = {**found, **({AGAIN: floor} if floor is not None else {})}
    for number, order in enumerate(interleave([given, *finalists, *([AGAIN] if noise else [])], rounds)):
        runs: dict[str, Measured | None] = {}
        for key in order:
            if deadline is not None and time.perf_counter() >= deadline:
                return found
            runs[key] = measure(key, number)
        base = runs.get(given)
        for key in against:
            mine = runs.get(key)
            if base is None or mine is None or not base.value or not mine.value:
                continue
            against[key].ratios.append(advantage(mine.value, base.value))
            if mine.test is not None and base.test is not None:
                against[key].test_deltas.append(mine.test - base.test)
        if until_settled and settled(found, rounds - number - 1):
            return found
    return found
