"""What an autotune search is asked and what it finds: the objective a candidate is ranked by,
the search's settings (each checked beside its flag: `problems`), a candidate's row in the result
table, and the configuration a candidate is measured with."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.config import TrainConfig
from scaletrain.experiments.sweep import LR_SCALINGS
from scaletrain.training.rounds import LOSS_TOLERANCE, LOSS_TOLERANCE_16BIT


@dataclass(frozen=True, slots=True)
class Objective:
    """What a candidate is ranked by: run-summary figures (summed) and which way is better."""
    name: str
    summary_keys: tuple[str, ...]
    direction: str       # maximize or minimize
    shown: str           # the table's column

    def value(self, record) -> float | None:
        values = [record.summary_value(key) for key in self.summary_keys]
        return None if any(v is None for v in values) else float(sum(values))


THROUGHPUT = Objective("throughput", ("images_per_sec",), "maximize", "samples/s")
# The seeds' headline: training time (evaluation excluded) until the validation metric first
# reaches the target, plus the warm-up (compilation), which a user waits for too though every
# run's clock reports it apart. Batch size is searched as well (its LR by --lr-rule); each
# candidate trains until it gets there, so a faster step that needs more of them does not win
# (seed 003: images/sec rises with the batch, time to accuracy does not follow).
TIME_TO_TARGET = Objective("time-to-target", ("time_to_target_s", "warmup_s"), "minimize", "time to target")
OBJECTIVES = {o.name: o for o in (THROUGHPUT, TIME_TO_TARGET)}


@dataclass(frozen=True, slots=True)
class AutotuneSettings:
    out: Path
    trials: int                  # candidates measured (the baseline included), at most the grid
    steps: int = 20              # optimizer steps per epoch of the measured window
    epochs: int = 3              # of which the first is the warm-up
    device_memory: int | None = None
    loss_tolerance: float = LOSS_TOLERANCE
    loss_tolerance_16bit: float = LOSS_TOLERANCE_16BIT
    study_name: str = "autotune"
    only: tuple[str, ...] = ()   # knob labels to search (empty: every knob that applies)
    exhaustive: bool = False     # measure every candidate the planner keeps, in order (the grid)
    objective: Objective = THROUGHPUT
    lr_rule: str = "sqrt"        # time-to-target: how the LR follows the batch size (none, linear, sqrt)
    budget_s: float | None = None  # wall-clock bound of the whole search: the best so far is reported
    # A candidate running longer than this many times the baseline's whole run (its process, data,
    # warm-up and window) is stopped: hopeless, whatever it would measure.
    cap_factor: float = 10.0
    # A candidate training slower than the best so far divided by this, a second into an epoch, is
    # stopped there (pruned; one process per candidate: pruning.SpeedFloor).
    prune_factor: float = 3.0
    emulated: bool = False         # also measure precisions this device only emulates (skipped otherwise)
    # The finalists (the best few and the given configuration) measured again, interleaved, this
    # many rounds before the winner is named (training/rounds.py); 0: the search's own figures decide.
    # 5: the range of n paired ratios holds their median with probability 1 - 2**(1 - n), 75 % at 3
    # rounds and 94 % at 5 (and MEASURE.md asks 5 runs for time to accuracy).
    confirm_rounds: int = 5
    finalists: int = 2
    # Time to target: the confirmation's rounds are seeds (seed, seed + 1, ...), and a finalist
    # whose median final test metric is below the given configuration's by more than this is
    # refused, however fast it got there.
    test_tolerance: float = 0.005

    def problems(self) -> list[str]:
        out = []
        if self.trials < 1:
            out.append(f"--trials must be at least 1 (got {self.trials})")
        if self.steps < 1:
            out.append(f"--steps must be at least 1 (got {self.steps})")
        if self.epochs < 2:
            out.append(f"--window-epochs must be at least 2, a warm-up and a measured epoch (got {self.epochs})")
        if self.lr_rule not in LR_SCALINGS:
            out.append(f"--lr-rule must be one of {', '.join(LR_SCALINGS)} (got {self.lr_rule!r})")
        if self.budget_s is not None and not (self.budget_s > 0 and math.isfinite(self.budget_s)):
            out.append(f"--budget-s must be a positive number of seconds (got {self.budget_s})")
        if not (self.cap_factor > 1 and math.isfinite(self.cap_factor)):
            out.append(f"--cap-factor must be a number above 1 (got {self.cap_factor})")
        if not (self.prune_factor > 1 and math.isfinite(self.prune_factor)):
            out.append(f"--prune-factor must be a number above 1 (got {self.prune_factor})")
        if self.confirm_rounds < 0:
            out.append(f"--confirm-rounds must be 0 or more (got {self.confirm_rounds})")
        if not (self.test_tolerance >= 0 and math.isfinite(self.test_tolerance)):
            out.append(f"--test-tolerance must be 0 or a positive number (got {self.test_tolerance})")
        if self.finalists < 1:
            out.append(f"--finalists must be at least 1 (got {self.finalists})")
        for flag, value in (("--loss-tolerance", self.loss_tolerance),
                            ("--loss-tolerance-16bit", self.loss_tolerance_16bit)):
            if not (value > 0 and math.isfinite(value)):
                out.append(f"{flag} must be a positive fraction (got {value})")
        return out


@dataclass(slots=True)
class Row:
    """One candidate in the result table."""
    params: dict
    outcome: str                      # measured, refused, pruned, failed, stopped (--budget-s), discarded, not tried
    value: float | None = None        # the objective's figure
    images_per_sec: float | None = None
    peak_memory_bytes: int | None = None
    warmup_s: float | None = None
    loss: list[float] = field(default_factory=list)
    departure: float | None = None
    why: str = ""
    run_id: str | None = None
    trial: int | None = None
    # A finalist's interleaved rounds against the given configuration (training/rounds.py): the paired
    # advantage's median and range, and whether it won every round (else a tie).
    confirmed: list[float] = field(default_factory=list)
    wins: bool | None = None
    test_delta: float | None = None   # time to target: its median final test metric minus the given's


def study_group(study: str, out: Path, store: str) -> str:
    """The run-store group of a study's trials: `autotune-<study name>` for a study in its default
    folder (<store folder>/autotune/<name>); one in a folder of its own (--out) gets the folder's
    mark too, so two studies of one name in two folders never share a group (issue 66)."""
    out = Path(out).resolve()
    if out == (Path(store).parent / "autotune" / study).resolve():
        return f"autotune-{study}"
    return f"autotune-{study}-{hashlib.sha256(str(out).encode()).hexdigest()[:8]}"


def row_key(params: dict) -> str:
    """A candidate's identity: its knob values as canonical JSON."""
    return json.dumps(params, sort_keys=True)


def measuring_config(cfg: TrainConfig, s: AutotuneSettings, train_samples: int,
                     steps: int | None = None) -> TrainConfig:
    """For throughput, `cfg` cut to the measured window: the same seeded steps for every
    candidate (`steps` per epoch, else --steps), nothing but training inside it (no evaluation or
    target). For time to target, the whole training, stopped where validation first reaches the
    target. Neither saves a checkpoint or a model."""
    m = copy.deepcopy(cfg)
    if s.objective is TIME_TO_TARGET:
        m.eval_each_epoch, m.patience = True, 1
    else:
        m.epochs = s.epochs
        m.data.train_subset = min((steps or s.steps) * cfg.batch_size, train_samples)
        m.eval_each_epoch = False
        m.target = None
    m.early_stopping_patience = None
    m.save_model = False
    m.checkpoint.every = 0
    m.checkpoint.resume = None
    m.summary_json = None
    m.run_dir = None
    return m
