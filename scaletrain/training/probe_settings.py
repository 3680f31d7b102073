"""The run's own settings decided by the probe (probe.py measures; this decides what a run asks
and keeps): which questions `auto` left open (the precision, compile), what the user's cache
already answers for this model and machine (probe_cache.py), what this run's length allows, and
the settings and configuration that follow. Under several processes the chief calls it
(lifecycle/run.py) and every rank takes its answer."""

from __future__ import annotations

from collections.abc import Callable

import torch

from scaletrain.inputs import tensors
from scaletrain.training.defaults import Setting
from scaletrain.training.probe import (
    COMPILE,
    COMPILE_FLOOR_S,
    COMPILED,
    GRAPHS,
    Arm,
    budget_s,
    compile_from_figures,
    compile_unfit,
    precision_candidates,
    probe_config,
    run_probe,
    too_short,
)
from scaletrain.training.probe_cache import cache_key, cached_entry, remember


def probed_settings(cfg, dataset, task, settings: list[Setting], run_id: str, device: torch.device,
                    say: Callable[[str], None] = print, replicas: int = 1) -> tuple[list[Setting], float]:
    """`settings` with the ones `auto` chose by rule (precision, compile, CUDA graphs: `why` set) measured on
    the run's own step where that applies and pays (or read from the cache); writes the choices
    into `cfg`. Returns the settings and the seconds probing took. `replicas` > 1: the run's
    chief decides for a data-parallel run of that many processes, measuring one process's step
    (its share of the batch, its device and threads) on copies of its own, alone."""
    from scaletrain.distributed import divide_batch
    from scaletrain.precision.hardware import device_facts
    from scaletrain.training.build import set_thread_pools
    chosen = {s.name: s for s in settings if s.why is not None}
    precision, compiling, graphs = chosen.get("precision"), chosen.get("compile"), chosen.get(GRAPHS.setting)
    if not cfg.probe or (precision is None and compiling is None and graphs is None):
        return settings, 0.0
    facts = device_facts(device)
    if facts.kind not in ("cpu", "cuda"):    # an XLA device compiles each shape: a few steps measure its compiler
        return settings, 0.0
    reference = cfg.precision.policy
    candidates = precision_candidates(facts, reference) if precision is not None else []
    compile_asked, graphs_asked = compiling is not None, graphs is not None
    if not candidates and not compile_asked and not graphs_asked:
        return settings, 0.0
    division = divide_batch(cfg.batch_size, cfg.per_replica_batch_size, replicas, cfg.optim.grad_accum_steps,
                            cfg.accumulate_to_global)
    batch = division.per_replica
    out = {s.name: s for s in settings}

    def settled(decided: dict[str, tuple[object, str, dict | None]]) -> list[Setting]:
        for name, (value, why, figures) in decided.items():
            out[name] = Setting(name, value, why, figures)
        if "precision" in out:
            cfg.precision.policy = out["precision"].value
        if "compile" in out:
            cfg.compile = bool(out["compile"].value)
        # Only where on: off is the configuration's None already (one step per execution).
        if out.get(GRAPHS.setting) is not None and out[GRAPHS.setting].value:
            cfg.cuda_graphs = True
        return list(out.values())

    try:
        run_steps = max(len(dataset.train) // max(division.global_batch, 1), 1) * cfg.epochs
    except TypeError:     # a stream of unknown length: nothing predicts the run, nothing bounds a probe
        return settled(_unprobed("not probed: the data's length is unknown", precision if candidates else None,
                                 compiling, graphs)), 0.0
    threads = set_thread_pools(cfg).setting.value     # the run's count: the arms run with it
    questions = [reference, *candidates, *([COMPILED] if compile_asked else []),
                 *([GRAPHS.key] if graphs_asked else [])]
    key = _key(cfg, dataset, batch, f"{facts.kind} {facts.name}", threads, questions)
    # First the cache: a run too short to repay a probe still takes what a longer run of the same
    # model here measured (or `--probe-share 1` did once). A question the kept entry left open (a
    # compile its run's budget could not hold) is asked now, in the kept precision.
    raw = cached_entry(key) if key else None
    kept = _from_cache(raw, reference, candidates, compile_asked, graphs_asked, run_steps)
    open_precision = bool(candidates) and "precision" not in kept
    open_compile = compile_asked and "compile" not in kept
    open_graphs = graphs_asked and GRAPHS.setting not in kept
    if not open_precision and not open_compile and not open_graphs:
        return settled(kept), 0.0
    reference = kept["precision"][0] if "precision" in kept else reference
    candidates = candidates if open_precision else []
    unfit = (_compile_unfit_by_cache(raw, run_steps, cfg.probe_share)
             if open_compile and not open_precision and not open_graphs else None)
    if unfit:    # a step time measured here before says a compile cannot fit: no copy built
        return settled({**kept, **_unprobed(unfit, None, compiling)}), 0.0
    short = too_short(run_steps, 2 + (len(candidates) or 1), cfg.probe_share)
    if short:    # decided from the step count: no step taken
        return settled({**kept, **_unprobed(short, precision if open_precision else None,
                                            compiling if open_compile else None, graphs if open_graphs else None)}), 0.0

    make_arm = _arm_maker(cfg, dataset, task, threads, batch if replicas > 1 else None, device)
    asked = ", ".join([*([reference, *candidates] if candidates else []), *(["compile"] if open_compile else []),
                       *(["CUDA graphs"] if open_graphs else [])])
    say(f"probing {asked} on copies of this run's step, at most {cfg.probe_share:.0%} of the run's time "
        "(--no-probe: the rules alone)")
    probed = run_probe(reference, candidates, make_arm, run_steps, cfg.probe_share, open_compile, open_graphs)
    measured = probed.cache_entry()
    if key and measured:
        remember(key, {**(raw or {}), **measured}, run_id)
    return settled({**kept, **probed.decided()}), probed.seconds

def _compile_unfit_by_cache(raw: dict | None, run_steps: int, share: float) -> str | None:
    """Why a compile cannot be probed in this run's budget, from the step time a kept entry holds
    (None: it may fit, or nothing was kept)."""
    step_s = raw.get("step_s") if raw else None
    if share >= 1 or not isinstance(step_s, (int, float)) or step_s <= 0:
        return None
    predicted = step_s * run_steps
    budget = budget_s(predicted, share)
    return compile_unfit(budget, share, predicted) if budget < COMPILE_FLOOR_S else None


def _unprobed(reason: str, precision: Setting | None, compiling: Setting | None,
              graphs: Setting | None = None) -> dict:
    """The rule's choices of the questions left open (None: not open), with why they stay so; a
    switch beside a question that says the reason in full says its first words."""
    out = {}
    if precision is not None:
        out["precision"] = (precision.value, f"{precision.why}; {reason}", None)
    for switch in (compiling, graphs):
        if switch is not None:
            said = bool(out)
            out[switch.name] = (switch.value, f"{switch.why}; {reason.split(' (')[0] if said else reason}", None)
    return out


def _arm_maker(cfg, dataset, task, threads: int, per_replica_batch: int | None, device: torch.device):
    """make_arm for run_probe: a copy of the run in an arm's settings. With `per_replica_batch`
    (a run of several processes), a copy is one process of its own (a strategy of one on this
    rank's device), never another member of the group."""
    from scaletrain.distributed import build_strategy
    from scaletrain.distributed.env import DistEnv
    from scaletrain.training.build import build_training

    def make_arm(arm_key: str) -> Arm:
        arm_cfg = probe_config(cfg, arm_key, threads, per_replica_batch)
        strategy = build_strategy(arm_cfg.distributed, DistEnv()) if per_replica_batch is not None else None
        if strategy is not None:
            strategy.setup(str(device))
        return Arm(build_training(arm_cfg, strategy=strategy, dataset=dataset, task=task, checked=True).trainer,
                   dataset)
    return make_arm


def _from_cache(kept: dict | None, reference: str, candidates: list[str], compile_asked: bool, graphs_asked: bool,
                run_steps: int) -> dict[str, tuple[object, str, dict | None]]:
    """The decisions a kept cache entry holds for the questions this run asks, as its settings
    (empty: a miss). The cache file is the user's: only a precision this run could have chosen is
    taken from it, and a kept switch (compile, CUDA graphs) is judged again for this run's length."""
    if kept is None:
        return {}
    out: dict[str, tuple[object, str, dict | None]] = {}
    where = f"cached from run {kept['run_id']}"
    if candidates and isinstance(kept.get("why"), str):
        if kept.get("policy") not in (reference, *candidates):
            return {}
        out["precision"] = (kept["policy"], f"{where}: {kept['why']}", kept.get("figures"))
    policy = out["precision"][0] if "precision" in out else reference
    for switch, asked in ((COMPILE, compile_asked), (GRAPHS, graphs_asked)):
        if not asked or kept.get(switch.setting) is None:
            continue
        try:
            on, why, figures = compile_from_figures(kept[switch.setting], run_steps, switch)
        except (KeyError, TypeError, ValueError):     # edited: measured again
            continue
        if figures["policy"] == policy:
            out[switch.setting] = (on, f"{where}: {why}", figures)
    return out

def _key(cfg, dataset, batch: int, device: str, threads: int, candidates: list[str]) -> str | None:
    """The cache key of this run's model, built on the meta device (its structure, no memory; a
    builder that computes with tensor values for real: models/structure.py); None where the
    builder fails (the run's own build then says why)."""
    from scaletrain.tasks import build_task
    from scaletrain.training.preflight import meta_model
    try:
        example = tensors(dataset.examples.x)[0][:1]
        outputs = build_task(cfg.task, dataset.task).output_size(dataset)
        model = meta_model(cfg, (dataset.input_shape, outputs))
    except Exception:   # noqa: BLE001 - the user's builder failing: the run's own build says why
        return None
    return cache_key(model, example, batch, device, threads, candidates)
