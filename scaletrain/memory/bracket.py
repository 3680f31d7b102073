"""The largest batch that fits, once a batch that fits and a larger one that does not are known.

Both searches for it (the planner's traced steps, the batch-size finder's real ones) narrow the
same bracket. A batch's peak memory is the largest of a few lines in the batch (one per moment of
the step: at small batches the weights and their casts set it, at large ones the activations), so
it is increasing and convex. The chord between the bracket's ends then lies on or above the curve,
so its crossing of the budget fits and is exact once both ends lie on the last line; one more
probe at the next batch confirms it. The Illinois variant of regula falsi keeps curved stretches
from stalling the chord. Where a cost is unknown (a GPU trial that ran out of memory has no peak)
or there is no budget, the step is a bisection.
"""

from __future__ import annotations

from collections.abc import Callable


def largest_fitting(low: int, high: int, budget: float | None,
                    probe: Callable[[int], tuple[bool, float | None]]) -> int:
    """The largest batch in [low, high) that fits, given that `low` fits (or is 0) and `high`
    does not. `probe(n)` -> (fits, peak bytes or None); it is called again for batches it has
    already answered, so it must remember them (a trial is expensive)."""
    kept = 0   # probes in a row that kept `high`
    while high - low > 1:
        cost_low = probe(low)[1] if low > 0 else None
        cost_high = probe(high)[1]
        chord = budget is not None and cost_low is not None and cost_high is not None and cost_high > cost_low
        if chord:
            over_low = cost_low - budget
            over_high = (cost_high - budget) / 2 ** max(0, kept - 1)   # Illinois: a kept end weighs less
            at = low + int(-over_low * (high - low) // max(over_high - over_low, 1))
        else:
            at = (low + high) // 2
        at = min(max(at, low + 1), high - 1)
        if probe(at)[0]:
            low, kept = at, kept + 1
            # The chord's crossing is usually the answer: the next batch confirms it.
            if chord and low + 1 < high:
                if probe(low + 1)[0]:
                    low += 1
                else:
                    high = low + 1
        else:
            high, kept = at, 0
    return low
